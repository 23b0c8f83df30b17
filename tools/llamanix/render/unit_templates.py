"""The Jinja templates of the units llamanix writes (``render/templates``), one environment for
all of them: the servers' and routers' unit, the exporter's and the gateway's. Every value a
template places goes through render/systemd.py's ``finalize``, which refuses what that module's
writers did not quote."""

from __future__ import annotations

import functools

import jinja2

from llamanix.render import systemd


@functools.cache
def unit_template(name: str) -> jinja2.Template:
    """``templates/NAME``, compiled once per process: compiling it took a plan of 20 instances a
    fifth of its time."""
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("llamanix.render", "templates"),
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        undefined=jinja2.StrictUndefined,
        autoescape=False,  # systemd unit text, not HTML: render/systemd.py quotes each value
        finalize=systemd.finalize,
    )
    env.filters["words"] = systemd.words
    return env.get_template(name)
