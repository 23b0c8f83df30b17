# tests/nix/fake-nixpkgs as a nixpkgs from before _cuda (nixpkgs' CUDA helpers) would be.
args: builtins.removeAttrs (import ../fake-nixpkgs args) [ "_cuda" ]
