#!/usr/bin/env bash
# Render a NixOS host's llamanix units: the one command the NixOS module's units derivation runs
# (tests/test_nix.py runs it too, on the same JSON shape).
#
#   render-units.sh CONFIG_JSON HOST OUT [INSTANCE=CAPABILITIES_JSON ...]
#
# CONFIG_JSON has llamanix.toml's shape; each INSTANCE=FILE is the probe of that instance's
# llama-server (`llamanix variant probe BINARY --json`), which every rendered flag is checked against.
# Writes OUT/lib/systemd/system/llamanix-*.service and OUT/share/llamanix/{manifest.json,
# NAME.argv.json} (and prometheus/, grafana/ with a [metrics] table). A config mistake exits 2 with llamanix's one-line message and writes nothing.
set -euo pipefail

if [ "$#" -lt 3 ]; then
  echo "usage: $0 CONFIG_JSON HOST OUT [INSTANCE=CAPABILITIES_JSON ...]" >&2
  exit 2
fi
config=$1
host=$2
out=$3
shift 3

capabilities=()
for spec in "$@"; do
  capabilities+=(--capabilities "$spec")
done

# llamanix keeps the previous render beside a new one (for rollback); a scratch directory keeps
# that bookkeeping out of $out, which gets only what systemd and the tools read.
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
# Nothing may be read from or written to a home directory while building.
export HOME="$scratch/home"

llamanix render "$config" --host "$host" --out "$scratch/render" "${capabilities[@]}" >/dev/null

mkdir -p "$out/lib/systemd/system" "$out/share/llamanix"
cp "$scratch"/render/llamanix-*.service "$out/lib/systemd/system/"
cp "$scratch"/render/manifest.json "$scratch"/render/*.argv.json "$out/share/llamanix/"
# A router's config, for reading: its unit carries the same text.
for file in router-presets.ini llama-swap.yaml; do
  if [ -e "$scratch/render/$file" ]; then
    cp "$scratch/render/$file" "$out/share/llamanix/"
  fi
done
# With a [metrics] table: the alert rules and dashboards (the exporter's unit is copied above).
for dir in prometheus grafana; do
  if [ -d "$scratch/render/$dir" ]; then
    cp -r "$scratch/render/$dir" "$out/share/llamanix/"
  fi
done
