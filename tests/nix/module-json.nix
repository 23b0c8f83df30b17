# The JSON the NixOS module writes for the generator, made by the module's own functions
# (nix/lib.nix configData, defaults from nix/schema-options.nix), for tests/test_nix.py:
#
#   nix-instantiate --eval --strict --json tests/nix/module-json.nix --argstr spec '{...}'
#
# spec: { host, gpu?, cudaArchs?, gpuSandbox?, router?, instances: { NAME: { binary, settings } } },
# where settings are what a user writes under services.llamanix.instances.NAME and router what
# they write under services.llamanix.router, a llama-server router (options left out take their
# defaults, as the module system would give them).
{ spec }:
let
  lib = import ./stub-lib.nix;
  llamanixLib = import ../../nix/lib.nix;
  schemaOptions = import ../../nix/schema-options.nix { inherit lib; };
  args = builtins.fromJSON spec;

  withDefaults =
    options: settings:
    builtins.mapAttrs (name: option: settings.${name} or (option.default or null)) options;

  optionValues =
    settings:
    withDefaults schemaOptions.instanceOptions settings
    // {
      speculative = withDefaults schemaOptions.speculativeOptions (settings.speculative or { });
    };
in
llamanixLib.configData {
  inherit (args) host;
  gpu = args.gpu or null;
  cudaArchs = args.cudaArchs or [ ];
  # The module's default, from the schema, as services.llamanix.gpuSandbox gives it.
  gpuSandbox = args.gpuSandbox or llamanixLib.schema.hosts.gpu_sandbox.default;
  router =
    if args ? router then
      {
        router = withDefaults schemaOptions.routerOptions args.router;
        binary = null;
      }
    else
      null;
  instances = builtins.mapAttrs (_: i: {
    inherit (i) binary;
    instance = optionValues i.settings;
  }) args.instances;
}
