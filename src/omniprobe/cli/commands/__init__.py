"""Every `omniprobe` command, one module each (its parser and its handler), in the order
`omniprobe --help` lists them."""

from omniprobe.cli.commands import (
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

COMMANDS = (validate, schema, report, image_check, standins, quality, evidence, wheels, env,
            host, select_host, probe, probe_offline, probe_capacity, probe_baseline, propagation,
            upstream, nox_args, timeline)
