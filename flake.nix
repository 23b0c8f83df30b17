{
  description = "llamanix: llama.cpp variants (nixpkgs, upstream, ik_llama.cpp, MTP PR) built reproducibly and run as hardened llama-server services";

  inputs = {
    # Needs CUDA >= 12.8 for sm_120 (RTX 50xx); pinned in flake.lock (see README.md, "Pins").
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
    # The branch of ggml-org/llama.cpp PR #22673 ("llama + spec: MTP Support").
    llama-cpp-mtp = {
      url = "github:am17an/llama.cpp/mtp-clean";
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
    }:
    let
      inherit (nixpkgs) lib;
      system = "x86_64-linux";
      llamanixLib = import ./nix/lib.nix;

      # Variant name -> source tree; the "nixpkgs" variant uses nixpkgs' own.
      sources = {
        upstream = llama-cpp-upstream;
        ik = ik-llama-cpp;
        mtp = llama-cpp-mtp;
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
        }
        // set.variants;

      pkgs = import nixpkgs {
        inherit system;
        overlays = [ overlay ];
        # CUDA is unfree; allow exactly its licenses. CUDA itself is switched on per package
        # (cudaArchs), not with nixpkgs' global cudaSupport, so nothing else is rebuilt.
        config.allowUnfreePredicate = llamanixLib.allowCudaUnfree;
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
      # `services.llamanix.instances = llamanix.lib.instancesFromToml ./llamanix.toml "gpu1";`
      # builds a host from the same llamanix.toml that `llamanix switch` edits.
      lib = { inherit (llamanixLib) instancesFromToml; };

      overlays.default = overlay;

      nixosModules.default =
        { lib, pkgs, ... }:
        {
          imports = [ ./modules/llamanix.nix ];
          services.llamanix.packageSet = lib.mkDefault self.legacyPackages.${pkgs.stdenv.hostPlatform.system}.llamanixPackages;
        };

      legacyPackages.${system} = {
        inherit (pkgs) llamanixPackages;
      };

      packages.${system} = pkgs.llamanixPackages.variants // {
        inherit (pkgs) llamanix;
        default = pkgs.llamanix;
      };

      apps.${system}.default = {
        type = "app";
        program = lib.getExe pkgs.llamanix;
        meta.description = "the llamanix command";
      };

      devShells.${system}.default = pkgs.mkShell {
        packages = [
          (pkgs.python3.withPackages (
            ps:
            pkgs.llamanix.runtimeDeps ps
            ++ (with ps; [
              hypothesis
              mypy
              pytest
              pytest-timeout
            ])
          ))
          pkgs.ruff
          pkgs.nixfmt
          # `llamanix` from this checkout (the tests run the command, as CI's pip install -e does).
          (pkgs.writeShellScriptBin "llamanix" ''exec python3 -m llamanix "$@"'')
        ];
        shellHook = ''
          export PYTHONPATH="$PWD/tools''${PYTHONPATH:+:$PYTHONPATH}"
        '';
      };

      # RFC-style nixfmt (the formatter nixpkgs uses; formerly the nixfmt-rfc-style attribute).
      formatter.${system} = pkgs.nixfmt;

      checks.${system} = {
        # The module's units for a CPU instance, rendered and checked against a probe of
        # nixpkgs' llama-server. More checks (a NixOS VM test, a GPU smoke test) belong here.
        module-units = exampleSystem.config.system.build.llamanixUnits;
      };
    };
}
