# The package set the NixOS module sees in the tests that evaluate it with nixpkgs' real lib
# (tests/nix/module-eval.nix, tests/nix/doc-eval.nix): derivations are plain attribute sets
# with store-like paths, so nothing is built. mkVariant gives a store path that names the
# variant and its architectures.
{
  lib,
  llamaSwap ? true,
  litellmVersion ? "1.80.0",
  # nixpkgs' config.cudaCapabilities of this package set (null: not set).
  cudaCapabilities ? null,
}:
let
  fake = name: "/nix/store/00000000000000000000000000000000-${name}";
  # nixpkgs' YAML format type (pkgs/pkgs-lib/formats.nix): what services.litellm.settings
  # accepts, freeform.
  yamlValue =
    with lib.types;
    nullOr (oneOf [
      bool
      int
      float
      str
      path
      (attrsOf yamlValue)
      (listOf yamlValue)
    ])
    // {
      description = "YAML value";
    };
  program = name: {
    type = "derivation";
    inherit name;
    outPath = fake name;
    meta.mainProgram = name;
  };
in
rec {
  # What mkVariant would build.
  fakePackage =
    { variant, cudaArchs }:
    {
      outPath = fake "llama-cpp-${variant}-${builtins.concatStringsSep "_" cudaArchs}";
      passthru.cudaSupport = cudaArchs != [ ];
      inherit variant cudaArchs;
    };
  packageSet = {
    llamanix.outPath = fake "llamanix";
    mkVariant = fakePackage;
    mkCapabilities = _: fake "capabilities.json";
  };
  litellm = program "litellm" // {
    name = "litellm-${litellmVersion}";
    version = litellmVersion;
    outPath = fake "litellm";
  };
  pkgs = {
    writeText = name: text: {
      inherit name text;
      outPath = fake name;
    };
    runCommand =
      name: attrs: script:
      attrs
      // {
        inherit name script;
        outPath = fake name;
      };
    runtimeShell = "/bin/sh";
    writeShellScript = name: text: {
      inherit name text;
      outPath = fake name;
    };
    fetchurl =
      { url, hash }:
      {
        inherit url hash;
        outPath = fake (baseNameOf url);
      };
    formats.yaml = _: {
      type = yamlValue;
      generate = name: value: {
        inherit name value;
        outPath = fake name;
      };
    };
    curl = program "curl";
    inherit litellm;
    stdenv.hostPlatform.system = "x86_64-linux";
    # What nixpkgs' own config says (pkgs.config), as far as the module reads it.
    config = {
      inherit cudaCapabilities;
    };
    llamanixPackages = packageSet;
  }
  // lib.optionalAttrs llamaSwap { llama-swap = program "llama-swap"; };
}
