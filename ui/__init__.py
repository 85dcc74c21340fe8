"""Gradio UI at /web: not built yet (issue "Gradio UI at /web"). Nothing here is mounted."""
