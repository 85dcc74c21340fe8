"""The leaf modules everything else builds on: the name list (`names`), the settings model (`settings`) and the
process helpers (`procs`). Stdlib and pydantic only; nothing here imports the rest of the project."""
