# What a llama-server build accepts, as `llamanix variant probe --json` reports it (its --version and
# --help, parsed): the NixOS module renders every instance against the probe of its own binary,
# so a flag the pinned commit does not know fails the build instead of the service.
#
# The probe runs the real binary inside the build sandbox. A CUDA build needs libcuda.so.1 to
# start, and the sandbox has no GPU driver, so it gets the CUDA stub library: ggml then reports
# "CUDA driver is a stub library", finds no device and goes on to print --version and --help
# (and that message is how the probe tells a CUDA build from a CPU one).
{
  lib,
  runCommand,
  linkFarm,
  cudaPackages,
  llamanix,
  llama-cpp,
}:
let
  cudaSupport = llama-cpp.passthru.cudaSupport or false;
  cudaStub = linkFarm "libcuda-stub" [
    {
      name = "libcuda.so.1";
      path = "${lib.getOutput "stubs" cudaPackages.cuda_cudart}/lib/stubs/libcuda.so";
    }
  ];
in
runCommand "${llama-cpp.name}-capabilities.json"
  {
    nativeBuildInputs = [ llamanix ];
    meta.description = "llamanix variant probe of ${llama-cpp.name}'s llama-server";
  }
  ''
    export HOME=$TMPDIR
    ${lib.optionalString cudaSupport "export LD_LIBRARY_PATH=${cudaStub}"}
    llamanix variant probe ${lib.getExe' llama-cpp "llama-server"} --json > $out
  ''
