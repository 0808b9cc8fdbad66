"""Every `omniprobe` command, one module each (its parser and its handler), in the order
`omniprobe --help` lists them."""

from omniprobe.cli.commands import (
    answer,
    env,
    evidence,
    host,
    image_check,
    nox_args,
    probe,
    probe_baseline,
    probe_capacity,
    probe_offline,
    propagation,
    quality,
    report,
    schema,
    select_host,
    standins,
    timeline,
    upstream,
    validate,
    wheels,
)

# What a user runs first (render, ask, check, add a card, build, probe, search), then the tools, then
# what the noxfile and the other commands call (nox-args, timeline).
COMMANDS = (report, answer, validate, host, env, probe, probe_offline, probe_capacity, probe_baseline,
            quality, image_check, evidence, wheels, propagation, upstream, standins, schema,
            select_host, nox_args, timeline)
