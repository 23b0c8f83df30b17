{
  description = "llamanix: llama.cpp variants (nixpkgs, upstream, ik_llama.cpp, MTP PR) built reproducibly and run as hardened llama-server services";

  inputs = {
    # Needs CUDA >= 12.8 for sm_120 (RTX 50xx); pinned in flake.lock (see docs/pins.md).
    nixpkgs.url = "github:NixOS/nixpkgs/nixos-unstable";

    # Sources only: every variant is built with the nixpkgs above, never with a flake of its own.
    llama-cpp-upstream = {
      url = "github:ggml-org/llama.cpp";
      flake = false;
    };
    ik-llama-cpp = {
      url = "github:ikawrakow/ik_llama.cpp";
      flake = false;
    };
    # ggml-org/llama.cpp PR #22673 ("llama + spec: MTP Support"), pinned by URL to its squash
    # merge into master: the PR's branch is gone once merged, and master has carried MTP since
    # (variant "upstream"). `nix flake update` keeps this commit (docs/pins.md).
    llama-cpp-mtp = {
      url = "github:ggml-org/llama.cpp/255582687b8dd211fdbc582e43ab842491554e94";
      flake = false;
    };
    # Anbeeld/beellama.cpp: DFlash drafting and TurboQuant KV caches (seeds 003 and 004).
    beellama-cpp = {
      url = "github:Anbeeld/beellama.cpp";
      flake = false;
    };
  };

  outputs =
    {
      self,
      nixpkgs,
      llama-cpp-upstream,
      ik-llama-cpp,
      llama-cpp-mtp,
      beellama-cpp,
    }:
    let
      inherit (nixpkgs) lib;
      llamanixLib = import ./nix/lib.nix;
      forAllSystems = lib.genAttrs llamanixLib.systems;

      # Variant name -> source tree; the "nixpkgs" variant uses nixpkgs' own.
      sources = {
        upstream = llama-cpp-upstream;
        ik = ik-llama-cpp;
        mtp = llama-cpp-mtp;
        beellama = beellama-cpp;
      };

      # What the llamanix package is built from: the Python tool and its metadata only, so
      # editing the Nix files or docs does not rebuild it.
      src = lib.fileset.toSource {
        root = ./.;
        fileset = lib.fileset.unions [
          ./pyproject.toml
          ./tools
          (lib.fileset.maybeMissing ./README.md)
        ];
      };

      # One package set, not a top-level attribute per variant and architecture: the variants
      # are pkgs.llamanixPackages.variants (and this flake's packages).
      overlay =
        final: _prev:
        let
          set = import ./pkgs {
            pkgs = final;
            inherit sources src;
          };
        in
        {
          llamanixPackages = set;
          inherit (set) llamanix;
        };

      # Everything that depends on the system: nixpkgs with the overlay, and what is built from it.
      perSystem =
        system:
        let
          pkgs = import nixpkgs {
            inherit system;
            overlays = [ overlay ];
            # CUDA is unfree; allow exactly its licenses, by nixpkgs' own predicate
            # (pkgs/development/cuda-modules/_cuda/lib). CUDA itself is switched on per package
            # (cudaArchs), not with nixpkgs' global cudaSupport, so nothing else is rebuilt.
            config.allowUnfreePredicate = package: allowUnfreeCuda package;
          };
          # Read from this very package set: nixpkgs calls the predicate only on a package's
          # license, long after the set exists, so no second nixpkgs is instantiated for it. A
          # nixpkgs from before _cuda (an older one through inputs.nixpkgs.follows) gets the same
          # rule over the NVIDIA licenses its lib names, and a warning.
          allowUnfreeCuda =
            pkgs._cuda.lib.allowUnfreeCudaPredicate or (lib.warn
              "llamanix: this nixpkgs has no _cuda (nixpkgs' CUDA helpers): CUDA's unfree licenses are allowed by llamanix's copy of its predicate, over the NVIDIA licenses lib.licenses names (${builtins.concatStringsSep ", " (llamanixLib.nvidiaLicenseNames lib.licenses)}); a newer nixpkgs has its own"
              (llamanixLib.cudaLicensePredicate lib.licenses)
            );

          # A tiny GGUF made at build time (`llamanix testbed synth-model`): the model of the VM test and
          # the GPU smoke checks, which may download nothing.
          syntheticModel = pkgs.callPackage ./pkgs/synthetic-model.nix { };

          # `llamanix check smoke` of every CUDA package on the builder's GPU. Not in `checks`: they need
          # the `cuda` system feature (docs/nixos.md, "Checking the builds").
          gpuChecks = pkgs.callPackage ./tests/gpu-smoke.nix {
            packages = pkgs.llamanixPackages.variants;
            model = syntheticModel;
          };

          # `nix run .#smoke -- VARIANT [sm120|sm86|cpu] [llamanix check smoke options]`: builds that
          # package of this flake and smokes it outside the sandbox, on this machine's GPU.
          smokeApp = pkgs.writeShellApplication {
            name = "llamanix-smoke";
            runtimeInputs = [
              pkgs.llamanix
              (lib.getBin pkgs.cudaPackages.cuda_cuobjdump)
            ];
            # Nix is the caller's own (its settings, its daemon), so it is not an input.
            text = ''
              usage="usage: nix run .#smoke -- VARIANT [${lib.concatStringsSep "|" llamanixLib.smokeArchs}] [llamanix check smoke options]; VARIANT is one of: ${lib.concatStringsSep " " llamanixLib.variants}"
              if [ "$#" -lt 1 ]; then
                echo "$usage" >&2
                exit 2
              fi
              variant=$1
              shift
              case "$variant" in
                ${lib.concatStringsSep "|" llamanixLib.variants}) ;;
                *)
                  echo "llamanix check smoke: unknown variant '$variant'; $usage" >&2
                  exit 2
                  ;;
              esac
              suffix=""
              case "''${1:-}" in
                ${lib.concatStringsSep "|" llamanixLib.smokeArchs})
                  suffix="-$1"
                  shift
                  ;;
              esac
              attr="llama-cpp-$variant$suffix"
              work=$(mktemp -d)
              trap 'rm -rf "$work"' EXIT
              # The out link keeps the build from being garbage-collected while it is smoked.
              nix --extra-experimental-features "nix-command flakes" build \
                --out-link "$work/result" "path:${self}#$attr"
              llamanix check smoke --binary "$work/result/bin/llama-server" --variant "$variant" "$@"
            '';
          };

          # An evaluation of the module with one CPU instance: builds (and so validates) its units.
          exampleSystem = lib.nixosSystem {
            modules = [
              self.nixosModules.default
              {
                nixpkgs.hostPlatform = system;
                networking.hostName = "llamanix-check";
                system.stateVersion = "25.11";
                services.llamanix = {
                  enable = true;
                  cudaArchs = [ ];
                  instances.tiny = {
                    variant = "nixpkgs";
                    model = "/var/lib/models/tiny.gguf";
                    alias = "tiny";
                    port = 8091;
                    context = 4096;
                    flash_attn = "on";
                    cache_type_k = "q8_0";
                    cache_type_v = "q8_0";
                  };
                };
              }
            ];
          };
        in
        {
          inherit
            pkgs
            syntheticModel
            gpuChecks
            smokeApp
            exampleSystem
            ;
        };
      systems = forAllSystems perSystem;
    in
    {
      # `services.llamanix = llamanix.lib.fromToml ./llamanix.toml "gpu1" // { enable = true; };`
      # builds a host from the same llamanix.toml that `llamanix switch` edits (its instances and
      # the host table's gpu and cuda_archs); instancesFromToml gives the instances alone.
      lib = { inherit (llamanixLib) fromToml instancesFromToml; };

      overlays.default = overlay;

      # services.llamanix.useSystemNixpkgs = true builds the variants with the system's own
      # nixpkgs (its overlays and config) through overlays.default; by default they come from
      # this flake's pinned nixpkgs, the set CI and the checks below were built with.
      nixosModules.default =
        {
          config,
          lib,
          # Every NixOS evaluation passes it; a bare call of the module (tests) may not.
          options ? { },
          pkgs,
          ...
        }:
        let
          system = pkgs.stdenv.hostPlatform.system;
          useSystemNixpkgs = config.services.llamanix.useSystemNixpkgs;
          # nixpkgs' readOnlyPkgs module (nixpkgs.pkgs given, nothing may add overlays) declares
          # none of the legacy options such as nixpkgs.localSystem; the usual module does.
          readOnlyPkgs = options ? nixpkgs && !(options.nixpkgs ? localSystem);
          readOnlyMessage = "services.llamanix.useSystemNixpkgs = true needs the llamanix overlay in this system's pkgs, but nixpkgs.pkgs is read-only (nixpkgs' readOnlyPkgs module) and lacks it: build those pkgs with `overlays = [ llamanix.overlays.default ]`, or leave useSystemNixpkgs off to use the flake's pinned set.";
          # The module system keeps one module per key: importing nixosModules.default twice (say,
          # directly and again through another flake's module) is then one import, not a second
          # definition of services.llamanix.packageSet. Errors name this file and attribute.
          key = "${self.outPath}/flake.nix#nixosModules.default";
        in
        {
          _file = key;
          inherit key;
          imports = [ ./modules/llamanix.nix ];
          # Every module of the system gets this flake as the argument `llamanix`, so one written
          # `{ llamanix, ... }:` (llamanix.lib.fromToml, say) works without specialArgs; the docs
          # write modules so. A `llamanix` of the user's own (specialArgs, _module.args) wins.
          _module.args.llamanix = lib.mkDefault self;
          nixpkgs.overlays = lib.mkIf (useSystemNixpkgs && !readOnlyPkgs) [ overlay ];
          assertions = [
            {
              assertion = !(useSystemNixpkgs && readOnlyPkgs && !(pkgs ? llamanixPackages));
              message = readOnlyMessage;
            }
          ];
          services.llamanix.packageSet = lib.mkDefault (
            if useSystemNixpkgs then
              pkgs.llamanixPackages or (throw readOnlyMessage)
            else
              self.legacyPackages.${system}.llamanixPackages or (throw (llamanixLib.unsupportedSystem system))
          );
        };

      legacyPackages = forAllSystems (system: {
        inherit (systems.${system}.pkgs) llamanixPackages;
        inherit (systems.${system}) gpuChecks syntheticModel;
      });

      packages = forAllSystems (
        system:
        let
          inherit (systems.${system}) pkgs;
        in
        pkgs.llamanixPackages.variants
        // {
          inherit (pkgs) llamanix;
          default = pkgs.llamanix;
        }
      );

      apps = forAllSystems (system: {
        default = {
          type = "app";
          program = lib.getExe systems.${system}.pkgs.llamanix;
          meta.description = "the llamanix command";
        };
        smoke = {
          type = "app";
          program = lib.getExe systems.${system}.smokeApp;
          meta.description = "build one llama.cpp package of this flake and run `llamanix check smoke` on it";
        };
      });

      devShells = forAllSystems (
        system:
        let
          inherit (systems.${system}) pkgs;
        in
        {
          default = pkgs.mkShell {
            packages = [
              # pyproject.toml's dependencies and its test and plot groups.
              (pkgs.python3.withPackages (
                ps:
                pkgs.llamanix.runtimeDeps ps
                ++ pkgs.llamanix.optionalDeps "test" ps
                ++ pkgs.llamanix.optionalDeps "plot" ps
              ))
              pkgs.nixfmt
              # `llamanix` from this checkout (the tests run the command, as CI's pip install -e does).
              (pkgs.writeShellScriptBin "llamanix" ''exec python3 -m llamanix "$@"'')
            ];
            shellHook = ''
              export PYTHONPATH="$PWD/tools''${PYTHONPATH:+:$PYTHONPATH}"
            '';
          };
        }
      );

      # RFC-style nixfmt (the formatter nixpkgs uses; formerly the nixfmt-rfc-style attribute).
      formatter = forAllSystems (system: systems.${system}.pkgs.nixfmt);

      # Everything here builds on a machine without a GPU (the VM test needs KVM). The GPU
      # checks are legacyPackages.<system>.gpuChecks: `nix build .#gpuChecks.gpu-smoke-sm120`.
      checks = forAllSystems (
        system:
        let
          inherit (systems.${system}) pkgs exampleSystem syntheticModel;
        in
        {
          # The module's units for a CPU instance, rendered and checked against a probe of
          # nixpkgs' llama-server.
          module-units = exampleSystem.config.system.build.llamanixUnits;

          # A NixOS VM running the module: serving, drafting, hardening, and a flip between the
          # CPU builds of two variants and back (tests/vm.nix).
          vm = import ./tests/vm.nix {
            inherit pkgs;
            module = self.nixosModules.default;
            model = syntheticModel;
          };
        }
      );
    };
}
