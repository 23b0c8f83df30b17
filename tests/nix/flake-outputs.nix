# The flake's outputs with a stand-in nixpkgs input (a lib, no packages), for tests/test_nix.py:
# what can be evaluated without nixpkgs' packages, i.e. which systems each output covers and
# what the module says on a system llamanix does not build for.
#
#   nix-instantiate --eval --strict --json tests/nix/flake-outputs.nix [--argstr libPath DIR]
#     [--argstr cuda false]
#
# cuda = "false": the nixpkgs input is one from before _cuda (nixpkgs' CUDA helpers).
{
  libPath ? "",
  cuda ? "true",
}:
let
  lib = if libPath == "" then import ./stub-lib.nix else import libPath;
  flake = import ../../flake.nix;
  source = name: { outPath = "/nix/store/00000000000000000000000000000000-${name}"; };
  outputs = flake.outputs {
    inherit self;
    nixpkgs = {
      inherit lib;
      # Importing it gives a package set that answers with its config (./fake-nixpkgs).
      outPath = if cuda == "true" then ./fake-nixpkgs else ./fake-nixpkgs-before-cuda;
      # One nixpkgs per system is enough: the flake must not instantiate a second one.
      legacyPackages = throw "flake-outputs.nix: the flake instantiated a second nixpkgs (nixpkgs.legacyPackages)";
    };
    llama-cpp-upstream = source "upstream";
    ik-llama-cpp = source "ik";
    llama-cpp-mtp = source "mtp";
    beellama-cpp = source "beellama";
  };
  # A flake's self is its outputs and the store path of its source.
  self = outputs // {
    outPath = "/nix/store/00000000000000000000000000000000-source";
  };
  # The module on a system without packages: the package set's default is what fails.
  moduleOn =
    system:
    (outputs.nixosModules.default {
      inherit lib;
      config.services.llamanix.useSystemNixpkgs = false;
      pkgs.stdenv.hostPlatform.system = system;
    }).services.llamanix.packageSet.content;
  supported = import ../../nix/lib.nix;
  # The module with useSystemNixpkgs = true, under nixpkgs' usual module (it declares the legacy
  # nixpkgs.localSystem) or under its readOnlyPkgs module (it does not), with pkgs lacking the
  # llamanix overlay: whether it adds its overlay, and the messages of its failed assertions.
  systemNixpkgs =
    nixpkgsOptions:
    let
      module = outputs.nixosModules.default {
        inherit lib;
        options.nixpkgs = nixpkgsOptions;
        config.services.llamanix.useSystemNixpkgs = true;
        pkgs.stdenv.hostPlatform.system = "x86_64-linux";
      };
    in
    {
      addsOverlay = module.nixpkgs.overlays.condition;
      failed = map (a: a.message) (builtins.filter (a: !a.assertion) module.assertions);
    };
  # The flake's module imported twice into one evaluation, as a system does that imports it
  # directly and again through another module (nixpkgs' lib only: the stub has no evalModules).
  # useSystemNixpkgs, so that the package set comes from pkgs rather than a pinned nixpkgs.
  importedTwice =
    let
      evaluated = lib.evalModules {
        modules = [
          outputs.nixosModules.default
          outputs.nixosModules.default
          (import ./nixos-stub.nix { inherit lib; })
          {
            _module.args.pkgs = {
              stdenv.hostPlatform.system = "x86_64-linux";
              llamanixPackages.marker = "the system's llamanix package set";
            };
            services.llamanix.useSystemNixpkgs = true;
          }
        ];
      };
    in
    {
      packageSet = evaluated.config.services.llamanix.packageSet.marker;
      overlays = builtins.length evaluated.config.nixpkgs.overlays;
      failed = map (a: a.message) (builtins.filter (a: !a.assertion) evaluated.config.assertions);
    };
  # What a module written `{ llamanix, ... }:` gets: the flake, from its module's _module.args,
  # or the user's own llamanix (their _module.args, or specialArgs) in its place.
  llamanixArgument =
    let
      probe =
        { llamanix, ... }:
        {
          options.probe = lib.mkOption { default = llamanix.outPath or llamanix; };
        };
      given =
        modules: specialArgs:
        (lib.evalModules {
          modules = [
            outputs.nixosModules.default
            (import ./nixos-stub.nix { inherit lib; })
            probe
            {
              _module.args.pkgs.stdenv.hostPlatform.system = "x86_64-linux";
              services.llamanix.packageSet = { };
            }
          ]
          ++ modules;
          inherit specialArgs;
        }).config.probe;
    in
    {
      flake = given [ ] { };
      own = given [ { _module.args.llamanix = "the user's"; } ] { };
      special = given [ ] { llamanix = "specialArgs'"; };
    };
in
{
  inherit importedTwice llamanixArgument;
  # The flake's nixpkgs, imported for its packages: which unfree licenses its config admits, for
  # a package of nixpkgs' _cuda licence, of NVIDIA's CUDA licence (lib.licenses.nvidiaCuda), of
  # another unfree licence, and a free one.
  unfree =
    let
      allowed = outputs.packages.x86_64-linux.llamanix.madeWith.allowUnfreePredicate;
      licensed = license: { meta = { inherit license; }; };
    in
    {
      nixpkgsCuda = allowed (licensed {
        shortName = "nixpkgs' _cuda licence";
        free = false;
      });
      nvidiaCuda = allowed (licensed lib.licenses.nvidiaCuda);
      otherUnfree = allowed (licensed {
        shortName = "unfree";
        free = false;
      });
      free = allowed (licensed [ lib.licenses.mit ]);
    };
  # What the overlay adds to a nixpkgs.
  overlayAttrs = builtins.attrNames (outputs.overlays.default { } { });
  # What makes a module one module however often it is imported.
  moduleIdentity = builtins.intersectAttrs {
    key = null;
    _file = null;
  } (
    outputs.nixosModules.default {
      inherit lib;
      config.services.llamanix.useSystemNixpkgs = false;
      pkgs.stdenv.hostPlatform.system = "x86_64-linux";
    }
  );
  systems = {
    packages = builtins.attrNames outputs.packages;
    legacyPackages = builtins.attrNames outputs.legacyPackages;
    apps = builtins.attrNames outputs.apps;
    devShells = builtins.attrNames outputs.devShells;
    checks = builtins.attrNames outputs.checks;
    formatter = builtins.attrNames outputs.formatter;
  };
  libFunctions = builtins.attrNames outputs.lib;
  expected = supported.systems;
  unsupportedMessage = supported.unsupportedSystem "riscv64-linux";
  # On a supported system the default is the flake's package set for it (a thunk that needs
  # nixpkgs, so only its presence is checked); on another one it throws unsupportedMessage,
  # which the test reads from the error of `moduleOnUnsupported`.
  moduleOnSupported = outputs.legacyPackages ? x86_64-linux;
  moduleOnUnsupported = builtins.seq (moduleOn "riscv64-linux") null;
  systemNixpkgsUsual = systemNixpkgs {
    localSystem = { };
    overlays = { };
  };
  systemNixpkgsReadOnly = systemNixpkgs {
    pkgs = { };
    overlays = { };
  };
}
