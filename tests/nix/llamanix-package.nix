# pkgs/llamanix.nix evaluated with a python3Packages that holds exactly the attribute names of
# tests/data/nixpkgs-python-attrs.txt, for tests/test_nix_deps.py:
#
#   nix-instantiate --eval --strict --json tests/nix/llamanix-package.nix [--argstr libPath DIR]
#     [--argstr src DIR]
#
# libPath: a nixpkgs lib (its lib/ directory) to use instead of the stub; src: the source tree
# whose pyproject.toml is read (default: this checkout).
{
  libPath ? "",
  src ? "",
}:
let
  stub = import ./stub-lib.nix;
  lib = if libPath == "" then stub else import libPath;
  recorded = builtins.filter (line: line != "" && builtins.substring 0 1 line != "#") (
    builtins.filter builtins.isString (
      builtins.split "\n" (builtins.readFile ../data/nixpkgs-python-attrs.txt)
    )
  );
  # Each attribute stands for itself, so the derived list reads back as names.
  python3Packages = builtins.listToAttrs (
    map (name: {
      inherit name;
      value = name;
    }) recorded
  ) // {
    python = {
      sitePackages = "lib/python3/site-packages";
      interpreter = "python3";
    };
    buildPythonApplication = args: args;
  };
  package = import ../../pkgs/llamanix.nix {
    inherit lib python3Packages;
    src = if src == "" then ../.. else /. + src;
  };
in
{
  inherit (package) pname version dependencies;
  buildSystem = package.build-system;
  plot = package.passthru.optionalDeps "plot" python3Packages;
  test = package.passthru.optionalDeps "test" python3Packages;
  inherit (package.passthru) helpChecks;
  installCheckPhase = package.installCheckPhase;
}
