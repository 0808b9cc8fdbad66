"""The offline propagation rule: a kwarg set that is another's plus one setting, and whether that
setting reached the model; and a check said in one line."""

from __future__ import annotations

from omniprobe.config.hosts import HostsConfig
from omniprobe.evidence.models.offline import OfflineRequest
from omniprobe.evidence.models.outputs import PropagationCheck


def kwarg_settings(kwargs: dict, prefix: str = "") -> dict[str, object]:
    """Every setting of an Omni(...) kwargs table by its dotted path (extras.KEY); a list is one
    setting."""
    settings: dict[str, object] = {}
    for key, value in kwargs.items():
        if isinstance(value, dict) and value:
            settings.update(kwarg_settings(value, f"{prefix}{key}."))
        else:
            settings[f"{prefix}{key}"] = value
    return settings


def offline_pairs(cfg: HostsConfig, kwarg_sets: list[str]) -> list[tuple[str, str, str]]:
    """(with, without, knob) for each kwarg set whose kwargs are another's plus exactly one
    setting, under the same environment; the first such twin in the given order."""
    pairs = []
    for with_ in kwarg_sets:
        mine = cfg.offline_kwarg_sets[with_]
        settings = kwarg_settings(mine.kwargs or {})
        for without in kwarg_sets:
            theirs = cfg.offline_kwarg_sets[without]
            if without == with_ or theirs.env != mine.env or theirs.kwargs is None:
                continue
            base = kwarg_settings(theirs.kwargs)
            extra = sorted(set(settings) - set(base))
            if len(extra) == 1 and all(settings.get(k) == v for k, v in base.items()):
                pairs.append((with_, without, extra[0]))
                break
    return pairs


def compare_offline(records: list[OfflineRequest], with_: str, without: str,
                    knob: str) -> PropagationCheck:
    """The check from the first fixture and seed both kwarg sets generated an image of."""
    base = {"knob": knob, "flag_set_with": with_, "flag_set_without": without, "via": "offline"}
    images = {(r.configuration, r.fixture, r.seed): r for r in records
              if r.outcome == "ok" and r.output_sha256 and r.pixels_sha256}
    for (kwarg_set, fixture, seed), a in images.items():
        b = images.get((without, fixture, seed))
        if kwarg_set == with_ and b is not None:
            return PropagationCheck(
                **base, fixture=fixture, seed=seed,
                bytes_identical=a.output_sha256 == b.output_sha256,
                pixels_identical=a.pixels_sha256 == b.pixels_sha256,
                note=f"generated {fixture} seed {seed} offline with {knob} ({with_}) and "
                     f"without it ({without})")
    return PropagationCheck(**base, note=f"not measured: {with_} and {without} generated no image "
                                         "of the same fixture and seed")


def unchecked_extras(cfg: HostsConfig, kwarg_sets: list[str]) -> list[str]:
    """The kwarg sets passing `extras` (which upstream's default diffusion path may never hand
    the model) with no twin among `kwarg_sets` to check them against."""
    paired = {with_ for with_, _, _ in offline_pairs(cfg, kwarg_sets)}
    return [k for k in kwarg_sets if k not in paired
            and (cfg.offline_kwarg_sets[k].kwargs or {}).get("extras")]


def offline_checks(cfg: HostsConfig, kwarg_sets: list[str],
                   records: list[OfflineRequest]) -> list[PropagationCheck]:
    return [compare_offline(records, *pair) for pair in offline_pairs(cfg, kwarg_sets)]


def describe(check: PropagationCheck) -> str:
    if check.reached_model is None:
        return f"{check.knob}: {check.note}"
    ignored = ("; the server logged that upstream ignored the deploy config"
               if check.deploy_config_ignored else "")
    if check.reached_model:
        return (f"{check.knob} reached the model: the outputs differ in bytes and in pixels "
                f"({check.flag_set_with} against {check.flag_set_without})")
    if not (check.bytes_identical or check.pixels_identical):  # the log alone says so
        return (f"{check.knob} did NOT reach the model ({check.flag_set_with} against "
                f"{check.flag_set_without}){ignored}")
    same = "byte-identical" if check.bytes_identical else "pixel-identical (bytes differ)"
    return (f"{check.knob} did NOT reach the model: the outputs are {same} "
            f"({check.flag_set_with} against {check.flag_set_without}){ignored}")
