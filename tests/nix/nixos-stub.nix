# Just enough of NixOS for services.llamanix (and nixpkgs' services.litellm) under nixpkgs' real
# lib.evalModules: the options the module (and the flake's nixosModules.default) reads or sets.
# For tests/nix/module-eval.nix and tests/nix/flake-outputs.nix.
#
# What two modules define together is typed as NixOS types it, so definitions merge as they
# would on a real system: systemd.services.<name> is a submodule whose list options
# concatenate, and serviceConfig values are nixpkgs' "systemd option" type (a list concatenates
# with the other definitions' lists, anything else must be defined once or equally), after
# nixos/lib/systemd-lib.nix and nixos/lib/systemd-unit-options.nix. networking.firewall has
# the options nixos/modules/services/networking/firewall.nix declares for TCP. The rest is
# declared loosely.
#
# services.litellm is not declared here: module-eval.nix loads nixpkgs' own litellm.nix, a loose
# stand-in for it, or nothing (a NixOS without that module).
{ lib }:
let
  inherit (lib) mkOption types;
  loose = mkOption {
    type = types.anything;
    default = { };
  };
  listOfStr = mkOption {
    type = types.listOf types.str;
    default = [ ];
  };
  unitOption = lib.mkOptionType {
    name = "systemd option";
    merge =
      loc: defs:
      let
        defs' = lib.filterOverrides defs;
      in
      if lib.any (def: lib.isList def.value) defs' then
        lib.concatMap (def: lib.toList def.value) defs'
      else
        lib.mergeEqualOption loc defs';
  };
  service = types.submodule {
    options = {
      description = mkOption {
        type = types.str;
        default = "";
      };
      wantedBy = listOfStr;
      requiredBy = listOfStr;
      after = listOfStr;
      before = listOfStr;
      wants = listOfStr;
      requires = listOfStr;
      partOf = listOfStr;
      environment = mkOption {
        type = types.attrsOf (types.nullOr (types.oneOf [ types.str types.path types.package ]));
        default = { };
      };
      serviceConfig = mkOption {
        type = types.attrsOf unitOption;
        default = { };
      };
      unitConfig = mkOption {
        type = types.attrsOf unitOption;
        default = { };
      };
      startLimitIntervalSec = mkOption {
        type = types.nullOr types.int;
        default = null;
      };
      startLimitBurst = mkOption {
        type = types.nullOr types.int;
        default = null;
      };
      overrideStrategy = mkOption {
        type = types.enum [
          "asDropinIfExists"
          "asDropin"
        ];
        default = "asDropinIfExists";
      };
    };
  };
  # A target, as far as the module sets one (nixos/lib/systemd-unit-options.nix).
  target = types.submodule {
    options = {
      description = mkOption {
        type = types.str;
        default = "";
      };
      wantedBy = listOfStr;
      requiredBy = listOfStr;
      after = listOfStr;
      before = listOfStr;
      wants = listOfStr;
      unitConfig = mkOption {
        type = types.attrsOf unitOption;
        default = { };
      };
    };
  };
  port = types.ints.u16;
in
{
  options = {
    networking.hostName = mkOption {
      type = types.str;
      default = "";
    };
    networking.firewall = {
      enable = mkOption {
        type = types.bool;
        default = true;
      };
      allowedTCPPorts = mkOption {
        type = types.listOf port;
        default = [ ];
      };
      allowedTCPPortRanges = mkOption {
        type = types.listOf (types.attrsOf port);
        default = [ ];
      };
      interfaces = mkOption {
        type = types.attrsOf (
          types.submodule {
            options.allowedTCPPorts = mkOption {
              type = types.listOf port;
              default = [ ];
            };
          }
        );
        default = { };
      };
    };
    hardware = loose;
    systemd.services = mkOption {
      type = types.attrsOf service;
      default = { };
    };
    systemd.targets = mkOption {
      type = types.attrsOf target;
      default = { };
    };
    systemd.packages = mkOption {
      type = types.listOf types.raw;
      default = [ ];
    };
    systemd.tmpfiles.rules = listOfStr;
    environment.etc = mkOption {
      type = types.attrsOf (
        types.submodule {
          options.source = mkOption { type = types.raw; };
        }
      );
      default = { };
    };
    environment.systemPackages = mkOption {
      type = types.listOf types.raw;
      default = [ ];
    };
    system.build = loose;
    # nixpkgs' services.prometheus, which services.llamanix.prometheus configures.
    services.prometheus = loose;
    meta = loose;
    # As nixpkgs' usual module declares them (its readOnlyPkgs module has no localSystem).
    nixpkgs.overlays = mkOption {
      type = types.listOf types.raw;
      default = [ ];
    };
    nixpkgs.localSystem = loose;
    nixpkgs.config = loose;
    assertions = mkOption {
      type = types.listOf types.attrs;
      default = [ ];
    };
    warnings = mkOption {
      type = types.listOf types.str;
      default = [ ];
    };
  };
}
