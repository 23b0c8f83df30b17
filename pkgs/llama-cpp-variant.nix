# One builder for every llama.cpp variant llamanix ships: nixpkgs' own llama-cpp package, rebuilt
# for the given CUDA architectures (or for the CPU), from its own source (variant "nixpkgs") or
# from another source tree (upstream master, ik_llama.cpp, the MTP merge, BeeLlama). BeeLlama needs
# nothing of its own: its TurboQuant kernels build with the rest, and it turns 12X into 12Xa.
#
#   callPackage ./llama-cpp-variant.nix {
#     variant = "ik";
#     source = inputs.ik-llama-cpp;   # a flake input (flake = false); null: nixpkgs' own src
#     cudaArchs = [ "8.6" "12.0" ];   # [ ] = CPU build
#   }
#
# Always built with the nixpkgs it is called from, never with the nixpkgs of the source's own
# flake.
{
  lib,
  callPackage,
  stdenv,
  llama-cpp,
  cudaPackages,
  # nixpkgs' CUDA database and helpers (pkgs/development/cuda-modules/_cuda), where this nixpkgs
  # has them.
  _cuda ? null,
  # What nixpkgs' recipe builds its web UI with (npm's setup hook and node), which a build from
  # another tree drops; compared as the recipe's own inputs, not by name.
  npmHooks ? { },
  nodejs ? null,
  nodejs_latest ? null,
  llamanix,
  variant,
  source ? null,
  cudaArchs ? [
    "8.6"
    "12.0"
  ],
  # Compiled into `--version`; must be an integer. Known for the pinned revisions, else 0.
  buildNumber ? (import ../nix/lib.nix).buildNumberOf (source.rev or ""),
}:
let
  llamanixLib = import ../nix/lib.nix;

  cudaSupport = cudaArchs != [ ];
  fromSource = source != null;
  isIk = variant == "ik";

  rev = source.rev or null; # a dirty local tree has none
  commit = if rev == null then "unknown" else builtins.substring 0 7 rev;

  # Reading a file of a flake input is plain evaluation (the input is fetched before the flake
  # is evaluated); reading one from a derivation's output would be import-from-derivation, so
  # such a source gets the older flag spelling, which every ggml still accepts.
  ggmlCMakeLists =
    if fromSource && !(lib.isDerivation source) then
      builtins.readFile "${source}/ggml/CMakeLists.txt"
    else
      null;

  cudaVersion = cudaPackages.cudaMajorMinorVersion or cudaPackages.cudaVersion or "0";
  # Each architecture against the first (and, for dropped or renamed ones, the last) CUDA
  # release that compiles it, from nixpkgs' own CUDA database where it has one (else the copy in
  # nix/lib.nix): 10.3 and 12.1 need 12.9, the family-specific `f` targets too, CUDA 13 calls 10.1
  # 11.0 and no longer builds Pascal; Jetson capabilities only with nixpkgs' Jetson packages.
  cudaProblems = lib.optionals cudaSupport (
    llamanixLib.cudaArchProblems {
      capabilities =
        if _cuda != null && _cuda ? db.cudaCapabilityToInfo then
          _cuda.db.cudaCapabilityToInfo
        else
          llamanixLib.cudaCapabilities;
      inherit cudaVersion cudaArchs;
      inherit (stdenv.hostPlatform) system;
      jetsonPackages =
        cudaPackages.backendStdenv.hasJetsonCudaCapability
          or cudaPackages.cudaPackagesConfig.hasJetsonCudaCapability
          or cudaPackages.flags.isJetsonBuild
          or false;
    }
  );
  isBeellama = variant == "beellama";

  # The arch list in the name tells the builds of one variant apart in the store
  # (llama-cpp-ik-cuda-sm86-sm120); nixpkgs' own CPU build keeps its name, so it stays the very
  # derivation cache.nixos.org has.
  archSuffix =
    if cudaSupport then
      "cuda-"
      + lib.concatMapStringsSep "-" (arch: "sm" + builtins.replaceStrings [ "." ] [ "" ] arch) cudaArchs
    else
      "cpu";

  cudaFlags = lib.optionals cudaSupport (
    [
      (lib.cmakeFeature "CMAKE_CUDA_ARCHITECTURES" (llamanixLib.cmakeCudaArchitectures cudaArchs))
    ]
    ++ llamanixLib.cudaFaQuantsFlags ggmlCMakeLists
  );

  sourceFlags = lib.optionals fromSource [
    (lib.cmakeFeature "LLAMA_BUILD_NUMBER" (toString buildNumber))
    (lib.cmakeFeature "LLAMA_BUILD_COMMIT" commit)
    # The UI is not built: since May 2026 upstream builds it with npm or downloads it from
    # Hugging Face at configure time, neither of which a sandboxed build may do. llama-server
    # runs without it. Both spellings, since either one left ON turns the UI build on. BeeLlama
    # embeds its UI from files in its tree (tools/server/public, through xxd.cmake), which needs
    # neither, so it keeps it.
    (lib.cmakeBool "LLAMA_BUILD_UI" false)
    (lib.cmakeBool "LLAMA_BUILD_WEBUI" isBeellama)
    (lib.cmakeBool "LLAMA_USE_PREBUILT_UI" false)
    (lib.cmakeBool "LLAMA_USE_PREBUILT_WEBUI" false)
  ];

  # ik_llama.cpp keeps llama-server among the examples, and its own Nix package skips the build
  # tree RPATH, which would otherwise leak /build paths into the installed binaries.
  ikFlags = lib.optionals isIk [
    (lib.cmakeBool "LLAMA_BUILD_EXAMPLES" true)
    (lib.cmakeBool "CMAKE_SKIP_BUILD_RPATH" true)
  ];

  ourFlags = cudaFlags ++ sourceFlags ++ ikFlags;
  # The names we (re)define, taken off nixpkgs' list first so cmake sees each only once.
  ourFlagNames = map (flag: builtins.head (builtins.match "-D([^:=]+).*" flag)) ourFlags ++ [
    "GGML_CUDA_FA_ALL_QUANTS"
    "GGML_CUDA_FA_QUANTS"
  ];

  # A recipe that can link a ggml package of its own (a `systemGgml` argument) builds the
  # tree's ggml instead wherever llamanix changes the build: that ggml is built for these
  # CUDA architectures, from this source. nixpkgs' own CPU build stays exactly nixpkgs'.
  recipeArgs = lib.functionArgs llama-cpp.override;
  base = llama-cpp.override (
    { inherit cudaSupport cudaPackages; }
    // lib.optionalAttrs ((fromSource || cudaSupport) && recipeArgs ? systemGgml) {
      systemGgml = false;
    }
  );

  # The recipe's npm inputs: its hook runs at postPatch and needs the npmDeps a build from
  # another tree does not fetch. The package set's own derivations (compared by store path), and
  # the same names where a caller hands none (an overlay's older nixpkgs).
  npmInputs =
    lib.optional (npmHooks ? npmConfigHook) npmHooks.npmConfigHook
    ++ lib.filter (drv: drv != null) [
      nodejs
      nodejs_latest
    ];
  isNpmInput =
    drv:
    builtins.elem drv npmInputs
    || builtins.elem (lib.getName drv) [
      "npm-config-hook"
      "nodejs"
    ];

  # nixpkgs' llama-cpp recipe (pkgs/by-name/ll/llama-cpp/package.nix) offers no attribute for its
  # shell completions, so its line is matched as written there; tests/nix/recipe-eval.nix checks
  # it against that recipe at the recorded revisions (tests/data/nixpkgs-llama-cpp.json).
  completion = "installShellCompletion --cmd llama-server --bash <($out/bin/llama-server --completion-bash)";
  withoutCompletion =
    text:
    let
      dropped = builtins.replaceStrings [ completion ] [ "" ] text;
    in
    if lib.hasInfix "--completion-bash" dropped then
      throw "llama-cpp-${variant}: nixpkgs' llama-cpp postInstall runs `llama-server --completion-bash` in a form llamanix does not know, which a CUDA build cannot run in the sandbox; update `completion` in pkgs/llama-cpp-variant.nix"
    else
      dropped;
in
assert lib.assertMsg (
  cudaProblems == [ ]
) "llama-cpp-${variant}: ${builtins.head cudaProblems}.";
assert lib.assertMsg (
  variant != "nixpkgs" || !fromSource
) "llama-cpp-nixpkgs is nixpkgs' own llama-cpp source; give other sources another variant name.";
base.overrideAttrs (
  finalAttrs: prev:
  {
    pname =
      if variant == "nixpkgs" && !cudaSupport then prev.pname else "llama-cpp-${variant}-${archSuffix}";

    cmakeFlags = llamanixLib.dropCMakeFlags ourFlagNames (prev.cmakeFlags or [ ]) ++ ourFlags;

    # Running the CUDA build (as nixpkgs' postInstall does for shell completions) would need a
    # GPU driver inside the sandbox; tests need model files. Nothing here runs the binary except
    # passthru.capabilities, which brings its own CUDA stub.
    doCheck = false;

    passthru = (prev.passthru or { }) // {
      inherit variant cudaArchs cudaSupport;
      sourceRevision = if fromSource then rev else prev.src.tag or prev.src.rev or prev.version;
      capabilities = callPackage ./llama-server-capabilities.nix {
        inherit llamanix;
        llama-cpp = finalAttrs.finalPackage;
      };
    };

    meta = (prev.meta or { }) // {
      description = "llama.cpp (${variant}) ${
        if cudaSupport then "for CUDA ${llamanixLib.cmakeCudaArchitectures cudaArchs}" else "for the CPU"
      }, as built by llamanix";
      mainProgram = "llama-server";
    };
  }
  // lib.optionalAttrs fromSource {
    src = source;
    version =
      if source ? lastModifiedDate then
        llamanixLib.unstableVersion source.lastModifiedDate
      else
        "0-unstable";

    # nixpkgs' patches and its postPatch target nixpkgs' own tag (its postPatch deletes a
    # prebuilt UI file that newer trees no longer have).
    patches = [ ];
    postPatch = lib.optionalString isIk ''
      # ik_llama.cpp takes its build info only from git, which the sandbox has not; say what
      # would have been found.
      substituteInPlace cmake/build-info.cmake \
        --replace-fail 'set(BUILD_NUMBER 0)' 'set(BUILD_NUMBER ${toString buildNumber})' \
        --replace-fail 'set(BUILD_COMMIT "unknown")' 'set(BUILD_COMMIT "${commit}")'
    '';

    # nixpkgs builds the UI with npm here and reads the commit from a file its fetcher wrote;
    # the commit is a cmake flag above and the UI is off, so no npm dependencies are fetched.
    preConfigure = "";
    npmDeps = null;
    nativeBuildInputs = builtins.filter (drv: !(isNpmInput drv)) (prev.nativeBuildInputs or [ ]);

  }
  # nixpkgs' own tree keeps nixpkgs' web UI, built from its pinned npm dependencies, which that
  # recipe names after the package: the CUDA build's own name would make them another
  # derivation, fetched again rather than the one cache.nixos.org has.
  // lib.optionalAttrs (!fromSource && cudaSupport && prev ? npmDeps) {
    inherit (base) npmDeps;
  }
  # nixpkgs' postInstall runs `llama-server --completion-bash` for shell completions: a CUDA
  # binary cannot run in the build sandbox (no driver), and another tree's server may not have
  # the flag (installShellCompletion refuses the empty output). Only that line goes; the rest of
  # nixpkgs' postInstall (the header, the `llama` link) stays.
  // lib.optionalAttrs (fromSource || cudaSupport) {
    postInstall = withoutCompletion (prev.postInstall or "");
  }
)
