# A tiny synthetic GGUF model, made at build time by `llamanix testbed synth-model` (written with
# nixpkgs' gguf Python package, which the llamanix package depends on), for tests that need a
# model but may download nothing: the NixOS VM test and the GPU smoke checks.
#
#   callPackage ./synthetic-model.nix { }                         # synth-model's defaults
#   callPackage ./synthetic-model.nix { args = [ "--seed" "3" ]; }
#
# The defaults are what the CPU tests use: the built-in vocabulary (no download) and a
# confident output projection, so the model drafting for itself is accepted (draft = target).
# Same arguments, same bytes.
{
  lib,
  runCommand,
  llamanix,
  name ? "llamanix-synthetic-model.gguf",
  args ? [ ],
}:
runCommand name
  {
    nativeBuildInputs = [ llamanix ];
    meta.description = "A synthetic llama-architecture GGUF made by `llamanix testbed synth-model`";
  }
  ''
    export HOME=$TMPDIR
    # Written next to itself first (synth-model writes atomically), then moved to $out.
    llamanix testbed synth-model "$TMPDIR/model.gguf" ${lib.escapeShellArgs args}
    mv "$TMPDIR/model.gguf" "$out"
  ''
