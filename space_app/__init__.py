"""Hugging Face Space packaging: README front matter in space_app/README.md; `push` is not built yet."""
