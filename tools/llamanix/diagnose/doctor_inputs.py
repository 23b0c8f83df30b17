"""What ``llamanix doctor`` was asked, turned into what its checks look at.

The command names a config and, for one instance, optional evidence: a saved log or the
journal, a live URL to probe, bench results. This module checks that those fit together, reads
each of them (files, journalctl, the server, nvidia-smi) and runs the checks, so the command
itself only parses options and prints the report.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, replace
from pathlib import Path

from llamanix.bench.bench_results import load_result
from llamanix.bench.prompts import load_prompts
from llamanix.bench.workloads import WorkloadFigures, measure_workloads
from llamanix.config.model import Config, load_config
from llamanix.core import file_reader
from llamanix.core.api_key import key_if_readable
from llamanix.core.errors import Problem, UserError
from llamanix.diagnose.doctor import Inputs, Report, diagnose, probe_server, query_gpus
from llamanix.external.journalctl import read_journal
from llamanix.model.ceiling import find_gpu
from llamanix.model.gguf_header import has_chat_template
from llamanix.render.manifest import unit_name
from llamanix.server.client import check_url
from llamanix.server.server_log import ServerLog, parse_server_log

SOURCE = "llamanix doctor"
# A saved log of a long-running server can be large; its start (what doctor reads) comes first.
LOG_LIMIT = 512 * 1024 * 1024


@dataclass(frozen=True)
class DoctorRequest:
    """What `llamanix doctor` was asked, option by option."""

    config_path: Path
    instance: str | None = None
    log_file: Path | None = None
    journal: bool = False
    url: str | None = None
    gpu: str | None = None
    bench_files: tuple[Path, ...] = ()
    avg_output_tokens: float | None = None
    # --prompts: measure each workload on --url (and on --baseline-url, without speculation).
    prompts: str | None = None
    baseline_url: str | None = None

    @property
    def per_instance(self) -> bool:
        """Was evidence about one running instance given (which then must be named)?"""
        return (
            self.log_file is not None
            or self.journal
            or self.url is not None
            or bool(self.bench_files)
        )


def _check_options(request: DoctorRequest) -> None:
    if request.prompts is not None and request.url is None:
        raise UserError(
            Problem(
                SOURCE,
                "--prompts",
                "measures a running server",
                "pass --url of the instance (and --baseline-url of the same model without "
                "speculation)",
            )
        )
    if request.baseline_url is not None:
        if request.prompts is None:
            raise UserError(
                Problem(
                    SOURCE,
                    "--baseline-url",
                    "is compared per workload of --prompts",
                    "pass --prompts too, e.g. --prompts realtext",
                )
            )
        check_url(request.baseline_url, SOURCE, "--baseline-url")
    if request.avg_output_tokens is not None and not request.avg_output_tokens > 0:
        raise UserError(
            Problem(
                SOURCE,
                "--avg-output-tokens",
                f"{request.avg_output_tokens:g} is not a positive number of tokens",
                "give the output tokens your requests average, e.g. 400",
            )
        )


def _instance(request: DoctorRequest, config: Config) -> str | None:
    """The instance the evidence is about: the one named, or the config's only one."""
    instance = request.instance
    if instance is not None and instance not in config.instances:
        raise UserError(
            Problem(
                str(request.config_path),
                "INSTANCE",
                f"no instance {instance!r}",
                f"choose one of {', '.join(config.instances)}",
            )
        )
    if request.log_file is not None and request.journal:
        raise UserError(
            Problem(SOURCE, "--log/--journal", "give one, not both", "pass --log FILE or --journal")
        )
    if request.per_instance and instance is None:
        if len(config.instances) != 1:
            raise UserError(
                Problem(
                    SOURCE,
                    "INSTANCE",
                    "--log, --journal, --url and --bench describe one instance",
                    "name the instance after the config",
                )
            )
        instance = next(iter(config.instances))
    return instance


def _read_log(request: DoctorRequest, config: Config, instance: str | None) -> ServerLog | None:
    """The server's log from --log or the journal; None when neither was asked for."""
    if request.log_file is not None:
        try:
            data = file_reader.read_bytes(request.log_file, limit=LOG_LIMIT, field="--log")
        except file_reader.FileRefused as err:
            problem = replace(err.problems[0], fix="give a saved llama-server log")
            raise UserError(problem) from None
        return parse_server_log(data.decode(errors="replace"))
    if not request.journal:
        return None
    assert instance is not None  # _instance picked one: --journal is per-instance evidence
    host = config.host_of(config.instances[instance])
    if host.target is not None:
        raise UserError(
            Problem(
                str(request.config_path),
                f"hosts.{host.name}.target",
                f"--journal reads this machine's journal, but {instance} runs on {host.target}",
                f"{shlex.join(['ssh', *host.target.ssh_args()])} journalctl -u "
                f"{unit_name(instance)} -o cat > "
                f"{instance}.log, then pass --log {instance}.log",
            )
        )
    # A router's member logs into the router's unit (mixed with the other members' lines).
    routed = host.router is not None and instance in host.router.members
    unit = unit_name("router" if routed else instance)
    return parse_server_log(read_journal(unit, user=host.kind == "systemd-user"))


def run_doctor(request: DoctorRequest) -> Report:
    """Check the options, read the evidence they name, and run every check."""
    _check_options(request)
    config = load_config(request.config_path)
    instance = _instance(request, config)
    names = [instance] if instance is not None else list(config.instances)
    if request.gpu:
        find_gpu(request.gpu, SOURCE)
    log = _read_log(request, config, instance)
    probe = None
    workloads: list[WorkloadFigures] = []
    if request.url is not None:
        assert instance is not None  # _instance picked one: --url is per-instance evidence
        check_url(request.url, SOURCE, "--url")
        prompt_list = load_prompts(request.prompts) if request.prompts is not None else None
        inst = config.instances[instance]
        router = config.hosts[inst.host].router
        routed = router is not None and instance in router.members
        key = key_if_readable(
            router.api_key_file if router is not None and routed else inst.api_key_file
        )
        # Behind a router the model name picks (and loads) the member.
        model = (inst.alias or inst.name) if routed else inst.alias
        # A base model answers raw text, not chat: probe it through /completion.
        raw = has_chat_template(Path(inst.model)) is False
        probe = probe_server(request.url, key, model, raw=raw)
        if prompt_list is not None:
            workloads = measure_workloads(
                request.url,
                prompt_list,
                api_key=key,
                model=model,
                baseline_url=request.baseline_url,
            )
    inputs = Inputs(
        log=log,
        probe=probe,
        workloads=workloads,
        benches=[load_result(f) for f in request.bench_files],
        avg_output_tokens=request.avg_output_tokens,
    )
    per_instance = {n: inputs for n in names} if instance is not None else {}
    return diagnose(config, names, per_instance, request.gpu, query_gpus())
