# GPU smoke checks: `llamanix check smoke` on every CUDA package of the flake, inside the Nix sandbox,
# on the builder's real GPU.
#
#   callPackage ./tests/gpu-smoke.nix { packages = <packages.<system>>; model = <a GGUF>; }
#
# Each check has `requiredSystemFeatures = [ "cuda" ]`, so only a builder that declares that
# feature builds it, and there nix-required-mounts (programs.nix-required-mounts with
# presets.nvidia-gpu) mounts the NVIDIA driver and /dev/nvidia* into the sandbox for it. They are
# deliberately not in the flake's `checks`: a machine without a GPU could not build them, and
# `nix flake check` must pass there. The flake exposes them as legacyPackages.<system>.gpuChecks.
#
# A check runs the binary twice on the synthetic model with all layers offloaded: once plain and
# once drafting for itself (--spec draft). `llamanix check smoke` checks /health, two chat
# completions, /metrics, decode speed, drafting, and for a CUDA build the GPU device and offload
# lines of the log, SASS for the GPU's compute capability (cuobjdump --list-elf) and the first
# against the second request (a PTX JIT tell). Any failed check fails the build; the reports are
# $out/none.json and $out/draft.json. The result depends on the GPU of the machine that built
# it, so `nix build --rebuild` runs it again.
{
  lib,
  runCommand,
  linkFarm,
  cudaPackages,
  llamanix,
  packages,
  model,
}:
let
  llamanixLib = import ../nix/lib.nix;

  smoke =
    name:
    {
      package,
      variant,
      cudaArchs,
    }:
    let
      llama-cpp = packages.${package};
      server = lib.getExe' llama-cpp "llama-server";
      run =
        spec:
        "llamanix check smoke --binary ${server} --variant ${variant} --model ${model} --spec ${spec} -o $out/${spec}.json || failed=1";
    in
    runCommand "llamanix-${name}"
      {
        nativeBuildInputs = [
          llamanix
          # `llamanix check smoke` reads the SASS list of the CUDA library with it.
          (lib.getBin cudaPackages.cuda_cuobjdump)
        ];
        requiredSystemFeatures = [ "cuda" ];
        passthru = {
          inherit variant cudaArchs;
          package = llama-cpp;
        };
        meta.description = "llamanix check smoke of ${llama-cpp.name} on the builder's NVIDIA GPU (needs the cuda system feature)";
      }
      ''
        export HOME=$TMPDIR
        mkdir -p $out
        failed=0
        # Both runs, even when the first fails: the log then shows every failed check.
        ${run "none"}
        ${run "draft"}
        exit $failed
      '';

  checks = lib.mapAttrs smoke llamanixLib.gpuSmokeChecks;

  # gpu-smoke-sm120, gpu-smoke-sm86: every check a machine with that card can pass.
  groups = lib.mapAttrs (
    name: members:
    linkFarm "llamanix-${name}" (
      map (member: {
        name = member;
        path = checks.${member};
      }) members
    )
  ) llamanixLib.gpuSmokeGroups;
in
checks // groups
