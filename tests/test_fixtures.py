
import pytest

from omniprobe.config.fixtures import FixtureNotRunnable, load_fixtures

from .conftest import fixtures_problems


def test_unknowns_stay_unknown_and_refuse_to_run(repo):
    suite = load_fixtures(repo.fixtures_file)
    pair = suite.get("edit-compose-pair")
    assert (pair.width, pair.height) == (1248, 832)
    assert pair.prompt is None and not pair.runnable
    with pytest.raises(FixtureNotRunnable, match="prompt, references"):
        pair.require_runnable()
    assert suite.get("edit-compose-three").derived_from.removed_references == ["ref-shop-hesper"]
    assert suite.sampling.seeds == [2301, 2302, 2303, 2304]


def test_a_fully_stated_fixture_is_runnable(repo):
    suite = load_fixtures(repo.fixtures_file)
    t2i = suite.get("t2i").model_copy(update={"prompt": "p", "width": 8, "height": 8})
    assert t2i.require_runnable() is t2i


@pytest.mark.parametrize(
    ("mutate", "expected"),
    [
        (
            lambda d: d["fixtures"].append(dict(d["fixtures"][0])),
            "duplicate fixture ids: single-reference",
        ),
        (lambda d: d["fixtures"][1].update(reference_count=0),
         "$.fixtures[1]: an edit fixture has at least one reference"),
        (
            lambda d: d["fixtures"][2]["derived_from"].update(fixture="ghost"),
            "unknown fixture 'ghost'",
        ),
        (lambda d: d["sampling"].pop("seeds"), "$.sampling.seeds: required field is missing"),
    ],
)
def test_bad_fixtures_are_named(repo_copy, mutate, expected):
    problems = fixtures_problems(repo_copy, mutate)
    assert any(expected in p for p in problems), problems
