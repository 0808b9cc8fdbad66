"""Where the report's files lie, relative to the project root."""

from pathlib import Path

REPORT_FILE = Path("REPORT.md")
REPORT_DIR = Path("report")
HARNESS_FILE = REPORT_DIR / "HARNESS.md"
TIMELINES_DIR = REPORT_DIR / "timelines"
CAPACITY_DIR = REPORT_DIR / "capacity"
