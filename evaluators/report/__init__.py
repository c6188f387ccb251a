"""The promotion report: `model` (the Struct and its JSON), `build` (the one load-and-build),
`render` (format dispatch), `text`, `html`, `svg` (renderers import the model, never the builder).
"""
