import json

from omniprobe.evidence.schema import all_schemas, stale_schemas


def test_committed_schemas_are_fresh(repo):
    assert stale_schemas(repo.schema_dir) == []


def test_schemas_forbid_unknown_keys_and_carry_ranges():
    runs = all_schemas()["evidence.runs.schema.json"]
    defs = runs["$defs"]
    assert defs["ServeRun"]["additionalProperties"] is False
    assert set(defs["Range"]["required"]) == {"min", "max"}


def test_a_changed_schema_is_stale(repo_copy):
    path = repo_copy.schema_dir / "evidence.runs.schema.json"
    data = json.loads(path.read_text())
    data["title"] = "edited"
    path.write_text(json.dumps(data))
    assert stale_schemas(repo_copy.schema_dir) == ["evidence.runs.schema.json"]
