# pkgs/llama-cpp-variant.nix evaluated with the real nixpkgs lib and a stand-in llama-cpp (an
# attribute set whose overrideAttrs applies the builder's function), for tests/test_nix.py:
#
#   nix-instantiate --eval --strict --json tests/nix/variant-eval.nix \
#     --argstr libPath DIR --argstr sourceDir DIR
#
# sourceDir stands for a variant's source tree (the builder reads its ggml/CMakeLists.txt).
# Nothing is built: only the attributes the builder sets are read back (`-A cases`).
{
  libPath,
  sourceDir,
}:
let
  lib = import libPath;
  # What the builder reads of nixpkgs' llama-cpp: its name, flags and postInstall.
  nixpkgsAttrs = {
    pname = "llama-cpp";
    version = "7000";
    cmakeFlags = [ ];
    # nixpkgs' llama-cpp postInstall (pkgs/by-name/ll/llama-cpp/package.nix), as its lines read.
    postInstall = ''
      # Match previous binary name for this package
      ln -sf $out/bin/llama-cli $out/bin/llama

      mkdir -p $out/include
      cp $src/include/llama.h $out/include/

      installShellCompletion --cmd llama-server --bash <($out/bin/llama-server --completion-bash)
    '';
    nativeBuildInputs = [ ];
    passthru = { };
    meta = { };
    src.tag = "b7000";
  };
  llama-cpp.override = _: {
    overrideAttrs =
      f:
      let
        final = nixpkgsAttrs // f (final // { finalPackage = final; }) nixpkgsAttrs;
      in
      final;
  };
  # A nixpkgs CUDA database that knows one capability more than llamanix's copy, so a case can
  # tell which table the builder read.
  nixpkgsCuda.db.cudaCapabilityToInfo = (import ../../nix/lib.nix).cudaCapabilities // {
    "8.8" = {
      archName = "Ampere";
      minCudaMajorMinorVersion = "13.0";
      maxCudaMajorMinorVersion = null;
      isJetson = false;
    };
  };
  build =
    {
      variant,
      cudaArchs,
      fromSource ? true,
      cuda ? "12.8",
      system ? "x86_64-linux",
      jetsonPackages ? false,
      withNixpkgsDb ? false,
    }:
    import ../../pkgs/llama-cpp-variant.nix {
      inherit lib llama-cpp variant cudaArchs;
      callPackage = _: _: { };
      stdenv.hostPlatform.system = system;
      _cuda = if withNixpkgsDb then nixpkgsCuda else null;
      cudaPackages = {
        cudaMajorMinorVersion = cuda;
        backendStdenv.hasJetsonCudaCapability = jetsonPackages;
      };
      llamanix = { };
      source =
        if fromSource then
          {
            outPath = sourceDir;
            rev = "de55d9e2f6c24d3f0c8a8a2a296e486b2ccf80b2";
            lastModifiedDate = "20260725000000";
          }
        else
          null;
    };
  describe =
    args:
    let
      tried = builtins.tryEval (build args).pname;
      drv = build args;
    in
    if !tried.success then
      { evaluates = false; }
    else
      {
        evaluates = true;
        inherit (drv) pname;
        completionAtBuild = lib.hasInfix "completion-bash" drv.postInstall;
        # The rest of nixpkgs' postInstall stays.
        keepsNixpkgsPostInstall =
          lib.hasInfix "cp $src/include/llama.h $out/include/" drv.postInstall
          && lib.hasInfix "ln -sf $out/bin/llama-cli $out/bin/llama" drv.postInstall;
        webui = builtins.elem "-DLLAMA_BUILD_WEBUI:BOOL=TRUE" drv.cmakeFlags;
      };
in
{
  # `-A refused`: the builder's own message for an architecture its CUDA cannot compile.
  refused =
    (build {
      variant = "upstream";
      cudaArchs = [ "10.3" ];
    }).pname;
  # `-A jetsonOnX86`: Jetson capabilities on x86_64-linux (nixpkgs' rule).
  jetsonOnX86 =
    (build {
      variant = "upstream";
      cudaArchs = [ "8.7" ];
    }).pname;

  cases.nixpkgsCpu = describe {
    variant = "nixpkgs";
    cudaArchs = [ ];
    fromSource = false;
  };
  cases.nixpkgsCuda = describe {
    variant = "nixpkgs";
    cudaArchs = [
      "8.6"
      "12.0"
    ];
    fromSource = false;
  };
  cases.ikSm86 = describe {
    variant = "ik";
    cudaArchs = [ "8.6" ];
  };
  cases.upstreamCpu = describe {
    variant = "upstream";
    cudaArchs = [ ];
  };
  cases.beellamaCpu = describe {
    variant = "beellama";
    cudaArchs = [ ];
  };
  cases.sparkOnCuda128 = describe {
    variant = "upstream";
    cudaArchs = [ "12.1" ];
  };
  cases.sparkOnCuda129 = describe {
    variant = "upstream";
    cudaArchs = [ "12.1" ];
    cuda = "12.9";
  };
  # The CUDA releases per capability (nix/lib.nix cudaCapabilities, without a nixpkgs database).
  cases.b300OnCuda128 = describe {
    variant = "upstream";
    cudaArchs = [
      "8.6"
      "10.3"
    ];
  };
  cases.familyOnCuda129 = describe {
    variant = "upstream";
    cudaArchs = [ "12.0f" ];
    cuda = "12.9";
  };
  cases.thorOnCuda130 = describe {
    variant = "upstream";
    cudaArchs = [ "10.1" ];
    cuda = "13.0";
  };
  # nixpkgs' CUDA database decides where there is one: 8.8 is only in the fake one above.
  cases.dbOnlyCapabilityWithDb = describe {
    variant = "upstream";
    cudaArchs = [ "8.8" ];
    cuda = "13.0";
    withNixpkgsDb = true;
  };
  cases.dbOnlyCapabilityWithoutDb = describe {
    variant = "upstream";
    cudaArchs = [ "8.8" ];
    cuda = "13.0";
  };
  # Jetson Orin: only on aarch64-linux, alone, with nixpkgs' Jetson packages.
  cases.orinOnAarch64 = describe {
    variant = "upstream";
    cudaArchs = [ "8.7" ];
    system = "aarch64-linux";
    jetsonPackages = true;
  };
  cases.orinWithoutJetsonPackages = describe {
    variant = "upstream";
    cudaArchs = [ "8.7" ];
    system = "aarch64-linux";
  };
  cases.orinBesideAnRtx3090 = describe {
    variant = "upstream";
    cudaArchs = [
      "8.7"
      "8.6"
    ];
    system = "aarch64-linux";
    jetsonPackages = true;
  };
  cases.pascalOnCuda130 = describe {
    variant = "upstream";
    cudaArchs = [ "6.1" ];
    cuda = "13.0";
  };
}
