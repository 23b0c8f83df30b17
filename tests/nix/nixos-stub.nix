# Just enough of NixOS for services.llamanix under nixpkgs' real lib.evalModules: the options the
# module (and the flake's nixosModules.default) reads or sets, declared loosely. For
# tests/nix/module-eval.nix and tests/nix/flake-outputs.nix.
{ lib }:
let
  inherit (lib) mkOption types;
  loose = mkOption {
    type = types.anything;
    default = { };
  };
in
{
  options = {
    networking.hostName = mkOption {
      type = types.str;
      default = "";
    };
    networking.firewall = loose;
    hardware = loose;
    systemd = loose;
    environment = loose;
    system.build = loose;
    # nixpkgs' services.litellm, which the gateway configures (its unit is systemd.services).
    services.litellm = loose;
    # nixpkgs' services.prometheus, which services.llamanix.prometheus configures.
    services.prometheus = loose;
    # As nixpkgs' usual module declares them (its readOnlyPkgs module has no localSystem).
    nixpkgs.overlays = mkOption {
      type = types.listOf types.raw;
      default = [ ];
    };
    nixpkgs.localSystem = loose;
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
