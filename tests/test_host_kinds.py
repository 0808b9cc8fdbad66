"""Each [hosts.<name>] states its kind, and its keys agree with it (issue 36 item 7)."""

from __future__ import annotations

import typing

import pytest

from omniprobe.config.host_entry import HostKind
from omniprobe.config.host_kinds import KIND_KEYS, kind_problems
from omniprobe.config.hosts import load_hosts
from omniprobe.errors import InputError

OMNI = {"kind": "omni", "name": "n", "serve_flag_sets": ["default"]}
SIM = {"kind": "sim", "name": "n", "serve_flag_sets": ["default"], "serve_command": ["x"],
       "simulated": True, "capacity": {}}
DIFFUSERS = {"kind": "diffusers", "name": "n", "diffusers": {}, "diffusers_profiles": ["p"]}


@pytest.mark.parametrize(("host", "expected"), [
    (OMNI, []),
    (SIM, []),
    (DIFFUSERS, []),
    ({**DIFFUSERS, "diffusers_profiles": None, "diffusers_profile_list": "l"}, []),
    # An emulated host need not state what it takes from the host it emulates.
    ({"kind": "omni", "emulation": {"emulates": "x"}}, []),
    ({"kind": "sim", "emulation": {}, "serve_command": ["x"]}, []),
    ({"name": "n"}, [("kind", "one of 'omni', 'sim', 'diffusers'; missing")]),
    ({**OMNI, "kind": "vllm"}, [("kind", "got 'vllm'")]),
    ({**OMNI, "capacity": {}}, [("capacity", "a 'omni' host")]),
    ({**OMNI, "diffusers": {}}, [("diffusers", "does not take it")]),
    ({"kind": "omni"}, [("serve_flag_sets", "a 'omni' host states it")]),
    ({k: v for k, v in SIM.items() if k != "serve_command"},
     [("serve_command", "a 'sim' host states it")]),
    # Diffusers hosts run profiles: flag sets and offline kwarg sets are another kind's.
    ({**DIFFUSERS, "serve_flag_sets": []}, [("serve_flag_sets", "a 'diffusers' host")]),
    ({**DIFFUSERS, "offline_kwarg_sets": []}, [("offline_kwarg_sets", "does not take it")]),
    ({**DIFFUSERS, "simulated": True}, [("simulated", "does not take it")]),
    ({"kind": "diffusers", "diffusers": {}},
     [("diffusers_profiles", "exactly one of diffusers_profiles, diffusers_profile_list; "
                             "got none")]),
    ({**DIFFUSERS, "diffusers_profile_list": "l"},
     [("diffusers_profile_list", "got diffusers_profiles, diffusers_profile_list")]),
    ({"kind": "diffusers", "diffusers_profiles": ["p"], "emulation": {}},
     [("diffusers", "a 'diffusers' host states it")]),
])
def test_kind_problems(host, expected):
    host = {k: v for k, v in host.items() if v is not None}
    got = kind_problems(host)
    assert [key for key, _ in got] == [key for key, _ in expected], got
    for (_, message), (_, fragment) in zip(got, expected, strict=True):
        assert fragment in message


def test_the_kind_literal_is_the_kinds_table():
    assert set(typing.get_args(HostKind)) == set(KIND_KEYS)


def test_every_committed_host_states_its_kind(repo):
    kinds = {name: h.kind for name, h in load_hosts(repo.hosts_file).hosts.items()}
    assert kinds["rtx3090"] == "omni" and kinds["sim"] == "sim"
    assert kinds["h200-diffusers"] == "diffusers"


def test_a_host_whose_keys_disagree_with_its_kind_is_refused_naming_file_host_and_key(repo_copy):
    text = repo_copy.hosts_file.read_text()
    repo_copy.hosts_file.write_text(text.replace(
        '[hosts.h200-diffusers]\nkind = "diffusers"\n',
        '[hosts.h200-diffusers]\nkind = "diffusers"\nserve_flag_sets = ["default"]\n', 1))
    with pytest.raises(InputError) as caught:
        load_hosts(repo_copy.hosts_file)
    (problem,) = caught.value.problems
    assert problem.file == str(repo_copy.hosts_file)
    assert problem.path == "[hosts.h200-diffusers] key 'serve_flag_sets'"
    assert "a 'diffusers' host" in problem.message and "does not take it" in problem.message
