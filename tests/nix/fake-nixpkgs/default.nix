# Stands in for nixpkgs' default.nix in tests/nix/flake-outputs.nix: the package set the flake
# imports, made with the config and overlays it passes. Its _cuda predicate admits one license
# name of its own, so a test tells it from any other; its callPackage answers with the config
# the set was made with, which is how a test reaches the flake's unfree predicate.
{
  config ? { },
  overlays ? [ ],
  ...
}:
let
  base = {
    inherit config;
    _cuda.lib.allowUnfreeCudaPredicate =
      package:
      builtins.all (license: license.free || license.shortName == "nixpkgs' _cuda licence") (
        if builtins.isList package.meta.license then package.meta.license else [ package.meta.license ]
      );
    callPackage = _: _: { madeWith = config; };
  };
  final = builtins.foldl' (prev: overlay: prev // overlay final prev) base overlays;
in
final
