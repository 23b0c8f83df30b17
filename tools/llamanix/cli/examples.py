"""Examples for every command's help, kept in one table so a test can check none is missing.

Each entry is shown at the end of ``llamanix COMMAND --help`` under "Examples:".
"""

from __future__ import annotations

import inspect

import click

EXAMPLES: dict[str, tuple[str, ...]] = {
    "init": (
        "llamanix init",
        "llamanix init /etc/llamanix/llamanix.toml --models /srv/models",
        "llamanix init new.toml --binary /opt/ik/bin/llama-server --host box --instance chat",
    ),
    "plan": (
        "llamanix plan llamanix.toml",
        "llamanix plan examples/rtx5090-qwen27b-draft.toml --json",
        "llamanix plan llamanix.toml --previous qwen=upstream.json --capabilities qwen=ik.json",
        "llamanix plan fleet.toml --host gpu1,gpu2",
        "llamanix plan llamanix.toml qwen --argv",
        "llamanix plan llamanix.toml qwen --argv --variant ik --capabilities caps.json",
    ),
    "validate": (
        "llamanix validate llamanix.toml",
        "llamanix validate examples/*.toml",
        "llamanix validate --remote examples/*.toml",
    ),
    "render": (
        "llamanix render llamanix.toml --out ./units",
        "llamanix render llamanix.toml --host gpu1 --out ./units --capabilities caps.json",
    ),
    "schema": (
        "llamanix schema --json > tools/llamanix/data/schema.json",
        "llamanix schema --markdown",
    ),
    "switch": (
        "llamanix switch llamanix.toml --set instances.qwen.variant=ik",
        "llamanix switch llamanix.toml --set instances.qwen.variant=upstream --gate bench "
        "--max-regression 5",
        "llamanix switch llamanix.toml --set instances.gemma.speculative.type=ngram-mod "
        "--gate bench --max-regression 5 --gate-prompts realtext:edit",
        "llamanix switch fleet.toml --host gpu1,gpu2 --set instances.qwen.parallel=2",
        "llamanix switch llamanix.toml --host all --dry-run",
    ),
    "rollback": (
        "llamanix rollback",
        "llamanix rollback llamanix.toml --host gpu1 --to 3",
        "llamanix rollback fleet.toml --host gpu1,gpu2",
    ),
    "tidy": (
        "llamanix tidy",
        "llamanix tidy llamanix.toml --host gpu1 --wait 60",
    ),
    "generations": (
        "llamanix generations",
        "llamanix generations llamanix.toml --host gpu1 --json",
        "llamanix generations fleet.toml --host all",
    ),
    "variant": (
        "llamanix variant pin llamanix.toml upstream --latest",
        "llamanix variant build llamanix.toml ik",
        "llamanix variant probe ./result/bin/llama-server --json > caps.json",
    ),
    "variant pin": (
        "llamanix variant pin llamanix.toml upstream --latest",
        "llamanix variant pin llamanix.toml ik 8337e4cd --flake ~/src/llamanix --dry-run",
        "llamanix variant pin llamanix.toml beellama --latest --dry-run --previous old.json "
        "--capabilities new.json",
    ),
    "variant build": (
        "llamanix variant build /etc/llamanix/llamanix.toml ik --flake ~/llamanix",
        "llamanix variant build llamanix.toml beellama --dry-run",
    ),
    "variant probe": (
        "llamanix variant probe /opt/llama.cpp/bin/llama-server",
        "llamanix variant probe ./result/bin/llama-server --json > caps.json",
        "llamanix variant probe --diff upstream.json beellama.json",
    ),
    "up": (
        "llamanix up llamanix.toml",
        "llamanix up llamanix.toml --host dev --timeout 600",
    ),
    "metrics": (
        "llamanix metrics llamanix.toml --host gpu1",
        "llamanix metrics llamanix.toml --once",
        "llamanix metrics llamanix.toml --listen 0.0.0.0 --port 9465",
    ),
    "top": (
        "llamanix top llamanix.toml",
        "llamanix top llamanix.toml --host gpu1 --interval 1",
        "llamanix top fleet.toml --host gpu1,gpu2",
        "llamanix top llamanix.toml --once --json --window 5",
    ),
    "readiness": (
        "llamanix readiness --url http://127.0.0.1:8080 --model /srv/models/qwen.gguf",
        "llamanix readiness --url http://127.0.0.1:8080 --timeout 30",
        "llamanix readiness --url http://127.0.0.1:8080 --served-model big --served-model small",
    ),
    "bench": (
        "llamanix bench --url http://127.0.0.1:8080 -o base.json",
        "llamanix bench --url http://127.0.0.1:8080 --prompts builtin:code-long "
        "--max-tokens 128,512 --runs 5 --json",
        "llamanix bench --url http://127.0.0.1:8080 --prompts agent:8000 "
        "--max-tokens 64,256,1024 -o base.json",
        "llamanix bench --url http://127.0.0.1:8080 --prompts realtext:edit --max-tokens 128",
        "llamanix bench compare base.json spec.json",
        "llamanix bench synthetic 0.3,0.6,0.9 --config llamanix.toml --instance qwen",
    ),
    "bench run": (
        "llamanix bench run --url http://127.0.0.1:8080 -o base.json",
        "llamanix bench run --url http://127.0.0.1:8080 --alias qwen --api-key-file key.txt",
    ),
    "bench compare": (
        "llamanix bench compare base.json spec.json",
        "llamanix bench compare base.json spec.json --json",
        "llamanix bench compare base.json spec.json --plot crossover.png",
    ),
    "bench synthetic": (
        "llamanix bench synthetic 0.3,0.6,0.9 --config llamanix.toml --instance qwen",
        "llamanix bench synthetic 0.5,0.9 --config c.toml --instance agent "
        "--prompts builtin:fibonacci --max-tokens 128 --runs 5 -o sweep.json",
    ),
    "check lossless": (
        "llamanix check lossless http://127.0.0.1:8080 http://127.0.0.1:8081",
        "llamanix check lossless http://127.0.0.1:8080 http://127.0.0.1:8081 --prompts mine.json "
        "--runs 5 --strict -o lossless.json",
        "llamanix check lossless http://127.0.0.1:8080 http://127.0.0.1:8081 --prompts realtext "
        "--max-tokens 64 --runs 1 --concurrency 4",
    ),
    "model ceiling": (
        "llamanix model ceiling --bandwidth 1792 --bytes 15.3GB",
        "llamanix model ceiling --gpu rtx3090 --model /srv/models/qwen.gguf",
        "llamanix model ceiling --list",
    ),
    "model inspect": (
        "llamanix model inspect /srv/models/Qwen3.6-27B-Q4_K_M.gguf",
        "llamanix model inspect draft.gguf --json",
    ),
    "model": (
        "llamanix model inspect /srv/models/Qwen3.6-27B-Q4_K_M.gguf",
        "llamanix model ceiling --gpu rtx3090 --model /srv/models/qwen.gguf",
    ),
    "check": (
        "llamanix check smoke --binary ./result/bin/llama-server",
        "llamanix check lossless http://127.0.0.1:8080 http://127.0.0.1:8081",
    ),
    "testbed": (
        "llamanix testbed build-server",
        "llamanix testbed fetch-model",
        "llamanix testbed demo",
    ),
    "doctor": (
        "llamanix doctor llamanix.toml",
        "llamanix doctor llamanix.toml qwen --url http://127.0.0.1:8080",
        "llamanix doctor llamanix.toml qwen --log server.log --json",
        "llamanix doctor llamanix.toml qwen --bench base.json --bench spec.json "
        "--avg-output-tokens 400",
        "llamanix doctor llamanix.toml gemma --url http://127.0.0.1:8081 --prompts realtext "
        "--baseline-url http://127.0.0.1:8080",
    ),
    "check smoke": (
        "llamanix check smoke --binary ./result/bin/llama-server",
        "llamanix check smoke --binary ./result/bin/llama-server --spec draft -o smoke.json",
    ),
    "testbed build-server": (
        "llamanix testbed build-server",
        "llamanix testbed build-server --print-path",
    ),
    "testbed fetch-model": (
        "llamanix testbed fetch-model",
        "llamanix testbed fetch-model --print-path",
    ),
    "testbed synth-model": (
        "llamanix testbed synth-model tiny.gguf",
        "llamanix testbed synth-model target.gguf --layers 8 --embd 512 --seed 1",
        "llamanix testbed synth-model draft.gguf --layers 1 --embd 512 --ff 2048 --type f32",
        "llamanix testbed synth-model target.gguf --layers 1 --passthrough 11 --embd 512 --ff 2048 "
        "--type f32",
    ),
    "testbed host-shell": (
        "llamanix testbed host-shell debian12",
        "llamanix testbed host-shell debian13 --bare",
    ),
    "testbed demo": (
        "llamanix testbed demo",
        "llamanix testbed demo --json",
        "llamanix testbed demo --keep ./demo --runs 5",
        "llamanix testbed demo --no-gate --tokens 32 --runs 3",
        "llamanix testbed demo --no-real --synthetic-gate",
    ),
}


def command_path(ctx_path: str) -> str:
    """ "llamanix bench compare" -> "bench compare"."""
    return ctx_path.split(" ", 1)[1] if " " in ctx_path else ctx_path


def with_examples(command: click.Command, path: str) -> None:
    """Append the examples of ``path`` to the command's help (and its subcommands')."""
    lines = EXAMPLES.get(path, ())
    if lines:
        block = "\n\n\b\nExamples:\n" + "\n".join(f"  {line}" for line in lines)
        # Docstrings keep their indentation until click formats them: dedent before appending.
        command.help = inspect.cleandoc(command.help or "") + block
    if isinstance(command, click.Group):
        for name, sub in command.commands.items():
            with_examples(sub, f"{path} {name}")
