#!/usr/bin/env python3
"""Build a tiny Llama-architecture causal LM and its tokenizer locally, for the real-engine check.

Nothing is downloaded. The byte-level BPE tokenizer is trained with ``tokenizers`` on
paragraphs taken from the Python standard library's own docstrings; the model is a
``transformers`` ``LlamaForCausalLM`` with seeded weights and, optionally, a few CPU
training steps on that same text (every other paragraph as a ChatML exchange), so that
greedy output is English-like and chat replies end with ``<|im_end|>`` (``finish_reason:
"stop"``) instead of always running to ``max_tokens``. For the same arguments on the same
machine the output is bit-for-bit reproducible.

The output folder is an ordinary Hugging Face model folder (``config.json``,
``model.safetensors``, ``tokenizer.json``, ``tokenizer_config.json``, a ChatML chat
template, ``generation_config.json`` with both end tokens) that vLLM loads directly.

vLLM's CPU attention needs ``head_dim = hidden / heads`` in {32, 64, 80, 96, 112, 128, ...}:
use hidden 64 with 2 heads or hidden 128 with 4 heads.

This script runs in the real-engine venv (``.real-engine/venv``, which has torch,
tokenizers and transformers through vLLM), not in the project's own venv::

    .real-engine/venv/bin/python bench/tiny_model.py .real-engine/tiny-llama \\
        --hidden 128 --layers 4 --heads 4 --kv-heads 2 --train-steps 1500
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import json
import random
import sys
from pathlib import Path
from typing import Any

BOS, EOS, PAD = "<|begin_of_text|>", "<|end_of_text|>", "<|pad|>"
IM_START, IM_END = "<|im_start|>", "<|im_end|>"
SPECIALS = [BOS, EOS, PAD, IM_START, IM_END]
MAX_LEN = 2048

# ChatML, with tools in the hermes form (what vLLM's `--tool-call-parser hermes` reads): the
# declared tools as a system turn of `<tools>` JSON lines, each assistant call as
# `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, each tool result as a `tool` turn in
# `<tool_response>`. A user, system or assistant turn with text only renders exactly as plain
# ChatML (the training text, so the weights do not depend on the tool parts); vLLM hands the
# template an assistant call's arguments parsed (a mapping) or, from other callers, as text.
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% if tools %}"
    "{{ '<|im_start|>system\n# Tools\n\nYou may call one or more of these functions:\n<tools>\n' }}"
    "{% for tool in tools %}"
    "{{ (tool['function'] if tool['function'] is defined else tool) | tojson }}{{ '\n' }}"
    "{% endfor %}"
    "{{ '</tools>\n\nFor each call, return a JSON object with the function name and arguments '"
    " 'in <tool_call></tool_call> tags:\n<tool_call>\n{\"name\": <function-name>, '"
    " '\"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n' }}"
    "{% endif %}"
    "{% for message in messages %}"
    "{% if message['role'] == 'assistant' and message['tool_calls'] %}"
    "{{ '<|im_start|>assistant\n' + (message['content'] or '') }}"
    "{% for call in message['tool_calls'] %}"
    "{% set fn = call['function'] if call['function'] is defined else call %}"
    "{% if message['content'] or not loop.first %}{{ '\n' }}{% endif %}"
    "{{ '<tool_call>\n{\"name\": \"' + fn['name'] + '\", \"arguments\": ' }}"
    "{% if fn['arguments'] is string %}{{ fn['arguments'] }}"
    "{% else %}{{ fn['arguments'] | tojson }}{% endif %}"
    "{{ '}\n</tool_call>' }}"
    "{% endfor %}"
    "{{ '<|im_end|>\n' }}"
    "{% elif message['role'] == 'tool' %}"
    "{{ '<|im_start|>tool\n<tool_response>\n' + message['content'] }}"
    "{{ '\n</tool_response><|im_end|>\n' }}"
    "{% else %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

# Standard-library modules whose docstrings make the training corpus (always there, offline).
CORPUS_MODULES = (
    "argparse", "collections", "json", "os", "random", "string", "textwrap", "unittest",
    "logging", "pathlib", "http.server", "email", "functools", "itertools",
)  # fmt: skip


def corpus_lines() -> list[str]:
    """Return de-duplicated one-line paragraphs from stdlib docstrings, in a fixed order."""
    out: list[str] = []
    seen: set[str] = set()
    for name in CORPUS_MODULES:
        module = importlib.import_module(name)
        for _, obj in inspect.getmembers(module):
            doc = inspect.getdoc(obj)
            if not doc or len(doc) <= 40:
                continue
            for para in doc.split("\n\n"):
                line = " ".join(para.split())
                if 20 < len(line) < 2000 and line not in seen:
                    seen.add(line)
                    out.append(line)
    return out


def build_tokenizer(lines: list[str], vocab_size: int) -> Any:
    """Train a byte-level BPE tokenizer and wrap it as a ``PreTrainedTokenizerFast``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers  # type: ignore[import-not-found, unused-ignore]
    from transformers import PreTrainedTokenizerFast  # type: ignore[import-not-found, unused-ignore]

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(lines, trainer=trainer)
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=BOS,
        eos_token=EOS,
        pad_token=PAD,
        additional_special_tokens=[IM_START, IM_END],
        clean_up_tokenization_spaces=False,
        model_max_length=MAX_LEN,
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def training_ids(tokenizer: Any, lines: list[str]) -> list[int]:
    """Token stream: even paragraphs as plain documents, odd ones as ChatML exchanges."""
    ids: list[int] = []
    for n, line in enumerate(lines):
        if n % 2 == 0:
            ids.extend(tokenizer.encode(line, add_special_tokens=False))
            ids.append(tokenizer.eos_token_id)
        else:
            words = line.split()
            messages = [
                {"role": "user", "content": "Tell me about " + " ".join(words[:3])},
                {"role": "assistant", "content": line},
            ]
            text = tokenizer.apply_chat_template(messages, tokenize=False)
            ids.extend(tokenizer.encode(text, add_special_tokens=False))
    return ids


def train(
    model: Any,
    tokenizer: Any,
    lines: list[str],
    steps: int,
    *,
    seq_len: int = 128,
    batch: int = 16,
    lr: float = 3e-3,
    seed: int = 0,
) -> None:
    """A few AdamW steps of next-token prediction on random windows of the corpus."""
    import torch  # type: ignore[import-not-found, unused-ignore]

    rng = random.Random(seed)
    data = torch.tensor(training_ids(tokenizer, lines), dtype=torch.long)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    model.train()
    for step in range(steps):
        starts = [rng.randrange(0, len(data) - seq_len - 1) for _ in range(batch)]
        x = torch.stack([data[s : s + seq_len] for s in starts])
        loss = model(input_ids=x, labels=x).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad()
        if step % 100 == 0 or step == steps - 1:
            print(f"step {step} loss {loss.item():.3f}", flush=True)
    model.eval()


def build(
    out_dir: Path,
    *,
    vocab: int = 512,
    hidden: int = 128,
    layers: int = 4,
    heads: int = 4,
    kv_heads: int = 2,
    train_steps: int = 1500,
    seed: int = 0,
    dtype: str = "float32",
) -> int:
    """Build the model and tokenizer into ``out_dir``; return the parameter count."""
    import torch  # type: ignore[import-not-found, unused-ignore]
    from transformers import LlamaConfig, LlamaForCausalLM  # type: ignore[import-not-found, unused-ignore]

    if hidden % heads or hidden // heads < 32:
        raise ValueError(f"head_dim = {hidden}/{heads} must be a whole number >= 32 for vLLM CPU")
    torch.manual_seed(seed)
    random.seed(seed)
    lines = corpus_lines()
    print(f"corpus: {len(lines)} paragraphs, {sum(map(len, lines))} chars", flush=True)
    tokenizer = build_tokenizer(lines, vocab)
    print(f"tokenizer vocab: {len(tokenizer)}", flush=True)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden,
        intermediate_size=hidden * 2,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=hidden // heads,
        max_position_embeddings=MAX_LEN,
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
        tie_word_embeddings=False,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    model = LlamaForCausalLM(config)
    if train_steps > 0:
        train(model, tokenizer, lines, train_steps, seed=seed)
    model = model.to(getattr(torch, dtype))
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(out_dir), safe_serialization=True)
    tokenizer.save_pretrained(str(out_dir))
    # vLLM also reads the end tokens from generation_config.json: add <|im_end|> so chats stop.
    gen_path = out_dir / "generation_config.json"
    gen: dict[str, Any] = json.loads(gen_path.read_text()) if gen_path.exists() else {}
    gen.update(
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=[tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids(IM_END)],
        pad_token_id=tokenizer.pad_token_id,
    )
    gen_path.write_text(json.dumps(gen, indent=2) + "\n")
    n_params = sum(p.numel() for p in model.parameters())
    meta = {"params": n_params, "hidden": hidden, "layers": layers, "heads": heads,
            "kv_heads": kv_heads, "vocab": len(tokenizer), "train_steps": train_steps,
            "seed": seed, "dtype": dtype}  # fmt: skip
    (out_dir / "canary-tiny-model.json").write_text(json.dumps(meta, indent=2) + "\n")
    print(f"saved to {out_dir}: {n_params} params", flush=True)
    return int(n_params)


def refresh_template(out_dir: Path) -> str:
    """Bring a built model's chat template up to `CHAT_TEMPLATE` without retraining, when the
    training text renders the same under both (the weights then do not depend on the change).

    Returns "current" (nothing to do), "rewritten" (the tokenizer files now carry the template)
    or "stale" (the training text renders differently: the model must be rebuilt)."""
    from transformers import PreTrainedTokenizerFast  # type: ignore[import-not-found, unused-ignore]

    tokenizer = PreTrainedTokenizerFast.from_pretrained(str(out_dir))
    if tokenizer.chat_template == CHAT_TEMPLATE:
        return "current"
    lines = corpus_lines()
    before = training_ids(tokenizer, lines)
    tokenizer.chat_template = CHAT_TEMPLATE
    if training_ids(tokenizer, lines) != before:
        return "stale"
    tokenizer.save_pretrained(str(out_dir))
    return "rewritten"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("out_dir", type=Path)
    ap.add_argument("--vocab", type=int, default=512)
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--heads", type=int, default=4, help="hidden/heads must be >= 32 (vLLM CPU)")
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--train-steps", type=int, default=1500)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument(
        "--refresh-template",
        action="store_true",
        help="only bring out_dir's chat template up to date; exit 3 when the model must be rebuilt",
    )
    args = ap.parse_args(argv)
    if args.refresh_template:
        outcome = refresh_template(args.out_dir)
        print(f"chat template: {outcome}", flush=True)
        return 3 if outcome == "stale" else 0
    build(
        args.out_dir,
        vocab=args.vocab,
        hidden=args.hidden,
        layers=args.layers,
        heads=args.heads,
        kv_heads=args.kv_heads,
        train_steps=args.train_steps,
        seed=args.seed,
        dtype=args.dtype,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
