"""probe-capacity's runner supervision and records: per Diffusers profile one runner, which builds
the pipeline once and bisects each reference count's pool limit (the runner's `--search`, the
rule in omniprobe_engine/search.py), or a fresh one where a runner closes (its engine could not
recover from a failure); every trial a CapacityTrial in capacity-trials.json as it arrives, every
profile a ProfileSearch in capacity.json with its bands.

The runner lives as probe-offline's does (runner_lifetime.py: started, capped, sampled,
stopped); a resumed attempt hands it the bands it holds and the trials of the count in progress,
which the search replays before it runs anything new.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass

from pydantic import ValidationError

from omniprobe.classify.failure_cause import classify_failure
from omniprobe.classify.oom import parse_oom
from omniprobe.config.fixtures import Fixture
from omniprobe.evidence.models.capacity import (
    CapacityBand,
    CapacityTrial,
    ProfileSearch,
    SearchSettings,
    TimedRequest,
)
from omniprobe.evidence.models.common import replaced
from omniprobe.evidence.models.offline import INIT_FAILED
from omniprobe.harness.common.progress import Progress
from omniprobe.harness.offline.matrix import OfflineEntry
from omniprobe.harness.offline.plan import PlannedRequest
from omniprobe.harness.offline.runner_events import (
    RunnerProtocolError,
    closed_reason,
    protocol_broken,
)
from omniprobe.harness.offline.runner_lifetime import RunnerSupervisor
from omniprobe.harness.offline.state import EntryState
from omniprobe.redaction import redact_text
from omniprobe_engine.protocol import (
    TRIAL_CARRIES,
    KnownBand,
    RecordedTrial,
    SearchCount,
    SearchSpec,
    SpeedSpec,
    as_json,
)

ATTEMPT_SUFFIX = "-capacity"


@dataclass(frozen=True)
class SearchPlan:
    settings: SearchSettings
    fixtures: dict[int, Fixture]  # reference count -> the fixture its trials run
    speed_steps: int = 0  # the timed request's steps, after the bands (0: none)


class CapacityProbe:
    """Runs the search of each profile; what it records lives in the attempt store."""

    def __init__(self, runner: RunnerSupervisor):
        self.runner, self.store, self.out = runner, runner.store, runner.out
        self.unfinished: list[str] = []
        self.environment_failures: list[str] = []  # the search records a failed build instead

    def search(self, entries: list[OfflineEntry], plan: SearchPlan) -> None:
        counts = sorted(plan.fixtures)
        progress = Progress(len(entries) * len(counts), self.out)
        progress.say(f"probe-capacity on {self.runner.host_name}: {len(entries)} profile(s) x "
                     f"{len(counts)} reference count(s), pool limits "
                     f"{plan.settings.floor_mib:,}-{plan.settings.ceiling_mib:,} MiB every "
                     f"{plan.settings.resolution_mib} MiB, {plan.settings.repeats} repeat(s) at "
                     f"each side; attempt {self.store.meta.id}")
        for number, entry in enumerate(entries, 1):
            done = self._search_of(entry.name)
            if done is not None and done.done(set(counts), plan.speed_steps):
                progress.say(f"[{entry.name}] searched already: "
                             + (done.init_outcome if done.init_outcome != "ready"
                                else f"{len(done.bands)} band(s)"))
                continue
            self._profile(f"{entry.name} {number}/{len(entries)}", entry, plan, progress)

    def _search_of(self, profile: str) -> ProfileSearch | None:
        return next((s for s in self.store.capacity if s.profile == profile), None)

    def _profile(self, label: str, entry: OfflineEntry, plan: SearchPlan,
                 progress: Progress) -> None:
        """One profile's search: one runner, or a fresh one each time a runner closes (its
        engine could not recover from a failure, or an error followed one), up to max_restarts;
        each lifetime's log, timeline and host RAM kept, and why it closed."""
        steps, guidance, _ = entry.sampling(self.runner.suite.sampling)
        seed = (entry.seeds or tuple(self.runner.suite.sampling.seeds))[0]
        if self._search_of(entry.name) is None:  # on record before its first trial: a resume
            self.store.put_search(ProfileSearch(  # is held to what it ran
                profile=entry.name, settings=entry.kwargs["profile"], search=plan.settings,
                num_inference_steps=steps, true_cfg_scale=guidance, seed=seed,
                sizes={f.id: f"{f.width}×{f.height}" for f in plan.fixtures.values()}))
        for _ in range(self.runner.settings.max_restarts + 1):
            closed = self._lifetime(label, entry, plan, seed, progress)
            if closed is None:
                return
            progress.say(f"[{label}] the runner closed ({closed}): a fresh runner takes the search "
                         "up")
        self.unfinished.append(f"{entry.name}: the search's runner closed "
                               f"{self.runner.settings.max_restarts + 1} times; re-run to resume "
                               "it")

    def _lifetime(self, label: str, entry: OfflineEntry, plan: SearchPlan, seed: int,
                  progress: Progress) -> str | None:
        """One runner over what is left of the search (as recorded); why it closed early, or
        None. What it kept, and why it closed, go on record as it ends."""
        search = self._search_of(entry.name)
        state = EntryState(build=search.build)  # the lifetimes of this search's runner only
        index = len(search.logs)
        # A runner interrupted before its logs were kept left its folder: never write into it.
        while (self.store.artifacts / entry.name / f"capacity-runner-{index + 1}").exists():
            index += 1
        folder = self.store.artifacts / entry.name / f"capacity-runner-{index + 1}"
        folder.mkdir(parents=True)
        spec = self._search_spec(entry, plan, seed, search, folder)
        args = self.runner.runner_args(entry, folder, "search", spec)
        gpu_s, closed = search.gpu_s or 0.0, None
        try:
            with self.runner.running(label, entry, index, folder, args, state, progress) as running:
                if running is not None:
                    closed = self._events(entry.name, plan, running, index, label, progress,
                                          search, gpu_s)
        finally:  # an interrupt too keeps what the runner built and left
            search = self._search_of(entry.name)
            failure = state.failure
            lifetimes = state.lifetimes
            self.store.put_search(replaced(
                search, build=state.build, restarts=[*search.restarts, *([closed] if closed else [])],
                logs=[*search.logs, *(lt.log for lt in lifetimes if lt.log)],
                timelines=[*search.timelines, *(lt.timeline for lt in lifetimes if lt.timeline)],
                host_ram=[*search.host_ram, *(lt.host_ram for lt in lifetimes if lt.host_ram)],
                init_outcome=INIT_FAILED[failure.outcome] if failure is not None else "ready",
                note=failure.note if failure is not None else search.note))
        return closed

    def _events(self, profile: str, plan: SearchPlan, running, index: int, label: str,
                progress: Progress, search: ProfileSearch, gpu_s: float) -> str | None:
        """The runner's events until it is done or closes (and why), each recorded as it
        arrives."""
        runner, events = running[0], running[1]
        while True:
            event, why = self.runner.next_event(runner, events, self.runner.settings.request_timeout_s)
            if event is None and why == "exited 0":
                raise RunnerProtocolError(f"{events.path}: the runner exited 0 before its 'done' "
                                          "event: expected a band for every count it was given; "
                                          "the runner broke the protocol")
            if event is None:
                self.unfinished.append(f"{profile}: the runner {why} during the search; "
                                       "re-run to resume it")
                return None
            if event["event"] in ("done", "closed"):
                runner.wait_exit(self.runner.settings.grace_s)
                search = replaced(search, gpu_s=round(gpu_s + time.monotonic() - runner.started, 1))
                self.store.put_search(search)
                return closed_reason(event) if event["event"] == "closed" else None
            if event["event"] == "trial":
                self._trial(profile, plan, event, index, label, progress)
            elif event["event"] == "speed":
                timed = timed_record(event, index)
                search = replaced(search, timed=[*search.timed, timed])
                self.store.put_search(search)
                progress.say(f"[{label}] timed: {timed_text(timed)}")
            elif event["event"] == "band":
                band = self._band(plan, event, events.path)
                search = search.model_copy(update={
                    "bands": [*[b for b in search.bands
                                if b.reference_count != band.reference_count], band],
                    "gpu_s": round(gpu_s + time.monotonic() - runner.started, 1)})
                self.store.put_search(search)
                progress.step(f"[{label}] {band.reference_count} reference(s): "
                              + band_text(band) + f" after {band.trials} trial(s)")
            else:
                raise RunnerProtocolError(f"{events.path}: expected a trial, a band or done, "
                                          f"got {event}")

    @staticmethod
    def _band(plan: SearchPlan, event: dict, path) -> CapacityBand:
        """A band event (its fields validated on arrival) as the band of a count searched."""
        refs = event["reference_count"]
        fixture = plan.fixtures.get(refs)
        if fixture is None or event["fixture"] != fixture.id:
            raise RunnerProtocolError(f"{path}: a band for {refs!r} reference(s), fixture "
                                      f"{event['fixture']!r}: not one this search asked for")
        try:
            return CapacityBand.model_validate(
                {k: v for k, v in event.items() if k != "event"})
        except ValidationError as exc:
            raise protocol_broken(path, "band", exc) from None

    def _search_spec(self, entry: OfflineEntry, plan: SearchPlan, seed: int,
                     search: ProfileSearch, folder) -> dict:
        counts = []
        bands = {b.reference_count: b for b in search.bands}
        for refs, fixture in sorted(plan.fixtures.items()):
            request = self.runner.request_spec(entry, PlannedRequest(fixture, seed), folder / "trial.png")
            band = bands.get(refs)
            counts.append(SearchCount(
                reference_count=refs, request=request,
                band=None if band is None else KnownBand(band.fits_at_mib, band.fails_at_mib),
                recorded=[] if band is not None else [
                    RecordedTrial(t.limit_mib, t.outcome) for t in self.store.capacity_trials
                    if t.profile == entry.name and t.reference_count == refs and t.counts]))
        settings = plan.settings
        speed = None
        if plan.speed_steps and not search.done(set(plan.fixtures), plan.speed_steps):
            refs, fixture = max(plan.fixtures.items())
            request = self.runner.request_spec(entry, PlannedRequest(fixture, seed),
                                               folder / "timed.png")
            speed = SpeedSpec(refs, dataclasses.replace(
                request, num_inference_steps=plan.speed_steps), settings.ceiling_mib)
        return as_json(SearchSpec(settings.floor_mib, settings.ceiling_mib,
                                  settings.resolution_mib, settings.repeats, counts, speed))

    def _trial(self, profile: str, plan: SearchPlan, event: dict, index: int, label: str,
               progress: Progress) -> None:
        refs = event.get("reference_count")
        fixture = plan.fixtures.get(refs) if isinstance(refs, int) else None
        if fixture is None or event.get("fixture") != fixture.id:
            raise RunnerProtocolError(f"a trial for {refs!r} reference(s), fixture "
                                      f"{event.get('fixture')!r}: not one this search asked for")
        trial = trial_record(profile, fixture, event, index, self.runner.model_code)
        self.store.add_trial(trial)
        peak = f", peak {trial.peak_mib:,.0f} MiB" if trial.peak_mib is not None else ""
        progress.say(f"[{label}] {refs} ref(s) at {trial.limit_mib:,} MiB"
                     f"{' (repeat)' if trial.repeat else ''}: {trial.outcome} "
                     f"{trial.wall_s:.1f} s{peak}"
                     + (f" (set aside: {trial.set_aside})" if trial.set_aside else ""))


def outcome_word(event: dict) -> str:
    """A trial's or timed request's outcome in the record's word: the runner's ok is a fit."""
    return {"ok": "fit"}.get(event["outcome"], event["outcome"])


def error_words(event: dict) -> str:
    """A failure's message as recorded: its head, redacted."""
    return redact_text((event.get("error") or "no message")[:500])


def trial_record(profile: str, fixture: Fixture, event: dict, lifetime: int,
                 model_code: tuple[str, ...]) -> CapacityTrial:
    """A trial event (its fields validated on arrival) as the trial it records: the figures of
    protocol.TRIAL_CARRIES kept, its failure's OOM and cause read off the runner's words."""
    measured = event.get("measured") or {}
    fields = {"profile": profile, "reference_count": event["reference_count"],
              "fixture": fixture.id, "inputs": fixture.inputs, "lifetime": lifetime,
              "outcome": outcome_word(event),
              **{k: event.get(k) for k in ("limit_mib", "phase", "repeat", "wall_s",
                                            "started_s", "peak_mib", "peak_source", "set_aside")},
              **{k: measured.get(k) for k in TRIAL_CARRIES},
              "mem_get_info_total_mib": (event.get("limit_mib")
                                         if event.get("peak_mib") is not None else None)}
    if fields["outcome"] != "fit":
        text = event.get("traceback") or event.get("error") or ""
        fields["error"] = error_words(event)
        if fields["outcome"] == "oom":
            fields["oom"] = parse_oom(text, "request", model_code)
        fields["cause"] = classify_failure(text, model_code)
    return CapacityTrial.model_validate(fields)


def timed_record(event: dict, lifetime: int) -> TimedRequest:
    """A speed event (its fields validated on arrival) as the timed request it records."""
    measured = event.get("measured") or {}
    return TimedRequest.model_validate({
        "outcome": outcome_word(event), "lifetime": lifetime,
        **{k: event.get(k) for k in ("reference_count", "fixture", "num_inference_steps",
                                      "limit_mib", "wall_s", "peak_mib")},
        **{k: measured.get(k) for k in TimedRequest.model_fields if k in measured},
        "error": None if event["outcome"] == "ok" else error_words(event)})


def timed_text(timed: TimedRequest) -> str:
    per_step = (f", {timed.step_after_first_s:.2f} s a step after the first"
                if timed.step_after_first_s is not None else "")
    return (f"{timed.reference_count} ref(s), {timed.num_inference_steps} steps: {timed.outcome} "
            f"in {timed.wall_s:.1f} s{per_step} (the measuring GPU's)")


def band_text(band: CapacityBand) -> str:
    if band.stopped:
        return f"no band ({band.stopped})"
    fits = f"fits at {band.fits_at_mib:,} MiB and above" if band.fits_at_mib else "no fit"
    fails = (f"fails at {band.fails_at_mib:,} and below" if band.fails_at_mib
             else "nothing failed down to the floor")
    return f"{fits}, {fails}"
