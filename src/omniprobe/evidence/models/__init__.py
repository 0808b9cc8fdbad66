"""The evidence file formats, one pydantic model per file (its content), grouped by file."""
