# The NixOS options llamanix declares, as data, for tests/test_nix.py (evaluated with
# `nix-instantiate --eval --strict --json`, no nixpkgs needed).
let
  lib = import ./stub-lib.nix;
  schema = (import ../../nix/lib.nix).schema;
  schemaOptions = import ../../nix/schema-options.nix { inherit lib; };

  # Types as JSON: predicates and submodules are functions, so they are left out here.
  strip =
    value:
    if builtins.isAttrs value then
      builtins.mapAttrs (_: strip) (
        builtins.removeAttrs value [
          "check"
          "module"
        ]
      )
    else if builtins.isList value then
      map strip value
    else
      value;

  # The addCheck predicate of a (nullOr) type, called at the schema minimum and just below it.
  boundsProbe =
    field: optionType:
    let
      inner = if optionType.name == "nullOr" then optionType.elem else optionType;
    in
    if inner.name == "addCheck" && field ? minimum then
      {
        atMinimum = inner.check field.minimum;
        belowMinimum = inner.check (field.minimum - 1);
      }
    else
      null;

  describe =
    table: options:
    builtins.mapAttrs (
      name: option:
      {
        type = strip option.type;
        hasDefault = option ? default;
        default = option.default or null;
        description = option.description;
        example = option.example or null;
        bounds = boundsProbe table.${name} option.type;
      }
    ) options;

  # The real module file, evaluated only as far as its option declarations.
  module = import ../../modules/llamanix.nix {
    inherit lib;
    options = { };
    pkgs = { };
    config = {
      services.llamanix = { };
      networking.hostName = "test";
    };
  };
  # With the options of the modules it imports (modules/prometheus.nix).
  prometheusModule = import ../../modules/prometheus.nix {
    inherit lib;
    config = module.config // {
      services.llamanix = { };
      networking.hostName = "test";
    };
  };
  top = module.options.services.llamanix // prometheusModule.options.services.llamanix;
  instanceOptions =
    (top.instances.type.elem.module {
      name = "test";
      config = {
        variant = "upstream";
        cudaArchs = [ ];
      };
    }).options;
in
{
  schemaInstanceOptions = describe schema.instances schemaOptions.instanceOptions;
  schemaSpeculativeOptions = describe schema.speculative schemaOptions.speculativeOptions;
  schemaRouterOptions = describe schema.router schemaOptions.routerOptions;
  moduleRouterOptions = builtins.attrNames top.router.type.elem.module.options;
  schemaGatewayOptions = describe schema.gateway schemaOptions.gatewayOptions;
  moduleGatewayOptions = builtins.attrNames top.gateway.type.elem.module.options;
  # The llama-swap package option, without its default (pkgs here has no llama-swap).
  moduleRouterPackage =
    let
      option = top.router.type.elem.module.options.package;
    in
    {
      type = strip option.type;
      inherit (option) defaultText description;
    };

  moduleTopOptions = builtins.attrNames top;
  moduleInstanceOptions = builtins.attrNames instanceOptions;
  moduleSpeculativeOptions = builtins.attrNames instanceOptions.speculative.type.module.options;
  moduleHostOptionTypes = {
    gpu = strip top.gpu.type;
    cudaArchs = strip top.cudaArchs.type;
    gpuSandbox = strip top.gpuSandbox.type;
  };
  moduleHostOptionDefaults = {
    gpuSandbox = top.gpuSandbox.default;
  };

  inherit (import ../../nix/lib.nix)
    instanceKeysSetByModule
    hostKeysSetByModule
    hostKeyOptions
    moduleOnlyInstanceOptions
    routerKeysSetByModule
    moduleOnlyRouterOptions
    gatewayKeysSetByModule
    moduleOnlyGatewayOptions
    ;
}
