"""The name of every project file and folder, defined once: config.project's Project joins them
to a root, and whatever else names one (the report's paths, the tests' copies) takes it here."""

from __future__ import annotations

HOSTS_FILE = "hosts.toml"
# The simulator's own configuration; it lies beside hosts.toml, which its hosts are in.
SIM_FILE = "sim.toml"
FIXTURES_DIR = "fixtures"
FIXTURES_FILE = "fixtures.json"
EVIDENCE_DIR = "evidence"
TEMPLATES_DIR = "templates"
REPORT_SETTINGS_FILE = "report.toml"
REPORT_FILE = "REPORT.md"
SCHEMA_DIR = "schemas"
ARTIFACTS_DIR = "artifacts"
