# pkgs/llama-cpp-variant.nix applied to nixpkgs' own llama-cpp recipe
# (pkgs/by-name/ll/llama-cpp/package.nix of NixOS/nixpkgs, a file fetched by its path and never
# committed: scripts/nix-real-lib), for tests/test_nix.py:
#
#   nix-instantiate --eval --strict --json tests/nix/recipe-eval.nix \
#     --argstr libPath DIR --argstr recipe FILE --argstr sourceDir DIR -A cases
#
# The recipe is called as nixpkgs' callPackage calls it: each argument it takes from the package
# set, from a stand-in set whose derivations are plain attribute sets, with the real lib
# (lib.makeOverridable, lib.systems) and a stdenv.mkDerivation that keeps nixpkgs' finalAttrs
# and overrideAttrs. Nothing is built; the attributes the variants end up with are read back.
# sourceDir stands for a variant's source tree (the builder reads its ggml/CMakeLists.txt).
{
  libPath,
  recipe,
  sourceDir,
}:
let
  lib = import libPath;
  platform = lib.systems.elaborate "x86_64-linux";
  store = name: "/nix/store/00000000000000000000000000000000-${name}";
  drv = name: {
    type = "derivation";
    inherit name;
    pname = name;
    outPath = store name;
    meta = { };
  };

  # nixpkgs' make-derivation.nix, as far as a recipe and an override see it: the function of
  # finalAttrs, finalPackage among them, and overrideAttrs extending that function.
  mkDerivationFrom =
    rattrs:
    let
      finalAttrs = args // {
        finalPackage = package;
      };
      args = rattrs finalAttrs;
      package =
        args
        // {
          type = "derivation";
          name = "${args.pname}-${args.version}";
          outPath = store "${args.pname}-${args.version}";
          overrideAttrs = f: mkDerivationFrom (lib.extends (lib.toExtension f) rattrs);
        }
        // (args.passthru or { });
    in
    package;
  stdenv = {
    inherit (platform) system;
    hostPlatform = platform;
    buildPlatform = platform;
    targetPlatform = platform;
    inherit (platform) isDarwin isLinux isAarch64;
    mkDerivation = f: mkDerivationFrom (if builtins.isFunction f then f else _: f);
  };

  # The package set the recipe is called from: what it names, by nixpkgs' attribute names.
  # npmHooks.npmConfigHook carries the name nixpkgs' makeSetupHook gives it.
  pkgs = {
    inherit lib stdenv;
    config = {
      cudaSupport = false;
      rocmSupport = false;
    };
    fetchFromGitHub =
      args:
      drv "source"
      // {
        inherit (args) owner repo;
        tag = args.tag or null;
        rev = args.rev or args.tag or null;
      };
    fetchNpmDeps = args: drv args.name;
    nix-update-script = _: [ "update-script" ];
    npmHooks.npmConfigHook = drv "npm-config-hook";
    nodejs = drv "nodejs";
    nodejs_latest = drv "nodejs" // {
      outPath = store "nodejs-latest";
    };
    cudaPackages = {
      backendStdenv = stdenv;
      cudaMajorMinorVersion = "12.8";
      flags.cmakeCudaArchitecturesString = "nixpkgs-default-archs";
      cuda_nvcc = drv "cuda_nvcc";
      cuda_cccl = drv "cuda_cccl";
      cccl = drv "cccl";
      cuda_cudart = drv "cuda_cudart";
      libcublas = drv "libcublas";
    };
    rocmPackages = { };
    llama-cpp = llamaCpp;
  };
  # Everything else the recipe takes without a default is a derivation of that name.
  recipeFunction = import recipe;
  recipeArgs = builtins.mapAttrs (name: _: pkgs.${name} or (drv name)) (
    lib.filterAttrs (name: hasDefault: !hasDefault || pkgs ? ${name}) (
      builtins.functionArgs recipeFunction
    )
  );
  llamaCpp = lib.makeOverridable recipeFunction recipeArgs;

  variant =
    {
      variant,
      cudaArchs,
      fromSource ? true,
    }:
    let
      builder = import ../../pkgs/llama-cpp-variant.nix;
    in
    # As callPackage calls it: what it takes of the package set, and the arguments given.
    builder (
      builtins.intersectAttrs (builtins.functionArgs builder) pkgs
      // {
        inherit variant cudaArchs;
        llama-cpp = llamaCpp;
        callPackage = _: _: { };
        llamanix = { };
        source =
          if fromSource then
            {
              outPath = sourceDir;
              rev = "0253fb21f595246f54c192fe8332f34173be251b";
              lastModifiedDate = "20260725000000";
            }
          else
            null;
      }
    );

  # The flags as { NAME = [ values ]; }: each name should appear once.
  flagsByName =
    flags:
    builtins.foldl' (
      acc: flag:
      let
        m = builtins.match "-D([^:=]+)(:[A-Z]+)?=(.*)" flag;
        name = builtins.head m;
      in
      if m == null then acc else acc // { ${name} = (acc.${name} or [ ]) ++ [ (lib.last m) ]; }
    ) { } (builtins.filter builtins.isString flags);
  names = map lib.getName;
  describe =
    package:
    let
      tried = builtins.tryEval (builtins.deepSeq package.postInstall package.pname);
    in
    if !tried.success then
      { evaluates = false; }
    else
      {
        evaluates = true;
        inherit (package) pname;
        flags = flagsByName package.cmakeFlags;
        nativeBuildInputs = names package.nativeBuildInputs;
        postInstall = package.postInstall;
        preConfigure = package.preConfigure or "";
        npmDeps = if (package.npmDeps or null) == null then null else lib.getName package.npmDeps;
        src = package.src.outPath or null;
      };
in
{
  # The recipe itself, as nixpkgs builds it for the CPU and with CUDA.
  recipe = {
    cpu = describe llamaCpp;
    cuda = describe (
      llamaCpp.override {
        cudaSupport = true;
      }
    );
    version = llamaCpp.version;
  };
  cases = {
    nixpkgsCpu = describe (variant {
      variant = "nixpkgs";
      cudaArchs = [ ];
      fromSource = false;
    });
    nixpkgsCuda = describe (variant {
      variant = "nixpkgs";
      cudaArchs = [
        "8.6"
        "12.0"
      ];
      fromSource = false;
    });
    upstreamCpu = describe (variant {
      variant = "upstream";
      cudaArchs = [ ];
    });
    upstreamCuda = describe (variant {
      variant = "upstream";
      cudaArchs = [ "12.0" ];
    });
    ikCuda = describe (variant {
      variant = "ik";
      cudaArchs = [ "8.6" ];
    });
    beellamaCpu = describe (variant {
      variant = "beellama";
      cudaArchs = [ ];
    });
  };
}
