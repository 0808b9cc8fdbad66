"""Where the report's files lie, relative to the project root."""

from pathlib import Path

from omniprobe import project_files

REPORT_FILE = Path(project_files.REPORT_FILE)
REPORT_DIR = Path("report")
HARNESS_FILE = REPORT_DIR / "HARNESS.md"
# What a reader of REPORT.md rarely needs: the full provenance, the verdict history, the audit of
# the seed's own figures, the sweeps the bands answer.
DETAILS_FILE = REPORT_DIR / "DETAILS.md"
TIMELINES_DIR = REPORT_DIR / "timelines"
CAPACITY_DIR = REPORT_DIR / "capacity"
