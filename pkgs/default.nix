# The llamanix package set for one nixpkgs: the llamanix command and every llama.cpp variant.
#
#   import ./pkgs { pkgs = final; sources = { upstream = ...; ik = ...; mtp = ...; }; src = ...; }
#
# sources: variant name -> its source tree (a flake input); "nixpkgs" has none.
{
  pkgs,
  sources,
  src,
}:
let
  llamanixLib = import ../nix/lib.nix;

  llamanix = pkgs.callPackage ./llamanix.nix { inherit src; };

  mkVariant =
    {
      variant,
      cudaArchs ? llamanixLib.archSets."",
    }:
    pkgs.callPackage ./llama-cpp-variant.nix {
      inherit llamanix variant cudaArchs;
      source = sources.${variant} or null;
    };

  mkCapabilities =
    package:
    pkgs.callPackage ./llama-server-capabilities.nix {
      inherit llamanix;
      llama-cpp = package;
    };
in
{
  inherit llamanix mkVariant mkCapabilities;
  # llama-cpp-VARIANT, -sm120, -sm86 and -cpu for every variant.
  variants = builtins.mapAttrs (_: mkVariant) llamanixLib.variantPackages;
}
