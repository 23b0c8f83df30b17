# One Nix block of README.md or docs/*.md, evaluated as a NixOS host evaluates it, with nixpkgs'
# real lib, for tests/test_nix_docs.py:
#
#   nix-instantiate --eval --strict --json tests/nix/doc-eval.nix --argstr libPath DIR \
#     --argstr block FILE --argstr kind KIND [--argstr litellmModule FILE]
#
# FILE is the block, written out by the test beside the files it names (./llamanix.toml,
# ./configuration.nix, ./llm.nix). KIND says what it is:
#   module   a NixOS module (a function or an attribute set; a snippet of bindings comes
#            wrapped in `{ config, lib, pkgs, llamanix, ... }: { ... }`), evaluated beside
#            the flake's nixosModules.default, as nixosSystem would without specialArgs
#   flake    a flake.nix whose outputs define nixosConfigurations (nixpkgs.lib.nixosSystem)
#   outputs  the outputs function of one (a snippet wrapped in `{ nixpkgs, llamanix, ... }:`)
#   inputs   an attribute set of flake inputs (`inputs.llamanix.inputs.NAME.url = ...;`)
# The llamanix flake is this checkout's flake.nix, its outputs made with a stand-in nixpkgs (as
# in tests/nix/flake-outputs.nix); the package set is tests/nix/fake-pkgs.nix, so nothing is
# built. Returns, per system: failed assertions, warnings and what the module made of it.
{
  libPath,
  block,
  kind,
  # nixpkgs' nixos/modules/services/misc/litellm.nix ("": a NixOS without it).
  litellmModule ? "",
}:
let
  lib = import libPath;
  fakes = import ./fake-pkgs.nix { inherit lib; };
  nixosStub = import ./nixos-stub.nix { inherit lib; };
  loose = lib.mkOption {
    type = lib.types.anything;
    default = { };
  };
  # The rest of NixOS the docs' modules set: declared, so a typo in a name still fails.
  docsStub = {
    options = {
      boot = loose;
      nix = loose;
      programs = loose;
      sops = loose;
      age = loose;
      system.stateVersion = loose;
      services.xserver = loose;
    };
  };

  source = name: { outPath = "/nix/store/00000000000000000000000000000000-${name}"; };
  flake = import ../../flake.nix;
  outputs = flake.outputs {
    inherit self;
    nixpkgs = {
      inherit lib;
      outPath = ./fake-nixpkgs;
    };
    llama-cpp-upstream = source "upstream";
    ik-llama-cpp = source "ik";
    llama-cpp-mtp = source "mtp";
    beellama-cpp = source "beellama";
  };
  self = outputs // source "llamanix";

  # What the host's own pkgs give the module, and nothing built.
  host = {
    _module.args.pkgs = fakes.pkgs;
    services.llamanix.packageSet = fakes.packageSet;
  };
  modulesOf =
    modules:
    modules
    ++ [
      nixosStub
      docsStub
      host
    ]
    ++ lib.optional (litellmModule != "") (/. + litellmModule);
  # nixpkgs.lib.nixosSystem, as far as a flake of the docs calls it.
  nixosSystem =
    args:
    lib.evalModules {
      modules = modulesOf args.modules;
      specialArgs = args.specialArgs or { };
    };

  describe =
    evaluated:
    let
      config = evaluated.config;
      failed = map (a: a.message) (builtins.filter (a: !a.assertion) config.assertions);
      units = config.system.build.llamanixUnits or null;
      litellm = config.services.litellm or { enable = false; };
    in
    if failed != [ ] then
      { inherit failed; }
    else
      {
        inherit failed;
        inherit (config) warnings;
        # Every instance a block defines, enabled or not (its definitions merged).
        instances = builtins.attrNames config.services.llamanix.instances;
        services = builtins.attrNames config.systemd.services;
        targets = builtins.attrNames config.systemd.targets;
        # The JSON `llamanix render` gets: every instance and setting, forced.
        rendered = if units == null then null else builtins.fromJSON units.passthru.configFile.text;
        gateway =
          if litellm.enable then
            {
              inherit (litellm) host port settings;
              unit = config.systemd.services.litellm.serviceConfig.EnvironmentFile;
            }
          else
            null;
        prometheus = {
          scrapeConfigs = config.services.prometheus.scrapeConfigs or null;
          ruleFiles = config.services.prometheus.ruleFiles or null;
        };
        firewall = config.networking.firewall.allowedTCPPorts;
        etc = builtins.attrNames config.environment.etc;
        overlays = builtins.length config.nixpkgs.overlays;
      };

  given = import (/. + block);
  systemsOf = outputsOf: builtins.mapAttrs (_: describe) outputsOf.nixosConfigurations;
  nixpkgsInput = {
    lib = lib // {
      inherit nixosSystem;
    };
  };
in
if kind == "module" then
  {
    default = describe (lib.evalModules {
      modules = modulesOf [
        outputs.nixosModules.default
        given
      ];
    });
  }
else if kind == "flake" then
  systemsOf (
    given.outputs {
      self = { };
      nixpkgs = nixpkgsInput;
      llamanix = self;
    }
  )
else if kind == "outputs" then
  systemsOf (given {
    nixpkgs = nixpkgsInput;
    llamanix = self;
  })
else if kind == "inputs" then
  {
    llamanix = builtins.attrNames (given.inputs.llamanix.inputs or { });
    known = builtins.attrNames flake.inputs;
  }
else
  throw "doc-eval.nix: kind is module, flake, outputs or inputs, not ${kind}"
