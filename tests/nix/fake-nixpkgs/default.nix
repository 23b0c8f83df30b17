# Stands in for nixpkgs' default.nix in tests/nix/flake-outputs.nix: importing it stops the
# evaluation with the config the flake imports nixpkgs with, which the test reads back.
{ config, ... }:
throw "nixpkgs imported with config.allowUnfreePredicate = ${config.allowUnfreePredicate}"
