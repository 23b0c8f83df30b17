# The NixOS VM test: services.llamanix on a real NixOS, flipped between two variants.
#
#   import ./tests/vm.nix { inherit pkgs; module = self.nixosModules.default; model = <GGUF>; }
#
# One VM runs one instance of the module on a synthetic model (a derivation: nothing is
# downloaded), built for the CPU from variant `base`. A specialisation flips the same instance
# to variant `other`. The script (vm-test-script.py, linted by tests/test_vm_script.py) checks
# the unit, /health, a chat completion, drafting with draft = target, the unit's hardening, then
# switches to the specialisation and back and checks which build answers each time.
#
# Beside it, a router: llama-server's router mode over two more instances of the same model
# (CPU members of variant `base`, at most one loaded). The script checks its unit and
# hardening, that /v1/models lists both members, a completion through the router's port, and
# that asking for the other member swaps them.
#
# In front of the router, the gateway: nixpkgs' services.litellm as the module runs it, one
# model group per member. Its master key is made at boot into /run/secrets, where sops-nix
# would put it. The script checks the unit's restart and ordering, a chat through the gateway
# with the key, and a refusal without it.
#
# Needs KVM (the builder's system-features must include kvm and nixos-test).
{
  pkgs,
  module,
  model,
  base ? "upstream",
  other ? "nixpkgs",
}:
let
  inherit (pkgs) lib;
  instance = "tiny";
  port = 8091;
  alias = "tiny";
  router = {
    port = 8092;
    # Served by their instance names (no alias).
    members = [
      "alpha"
      "beta"
    ];
  };
  gateway = {
    port = 4000;
    keyFile = "/run/secrets/llamanix-gateway-key";
  };
in
pkgs.testers.runNixOSTest {
  name = "llamanix-vm";

  nodes.machine =
    { config, ... }:
    let
      # The packages the module builds for `variant` when cudaArchs = [ ] (its default
      # `package`); the script checks that the running process is one of them.
      build = variant: config.services.llamanix.packageSet.mkVariant {
        inherit variant;
        cudaArchs = [ ];
      };
      expected = variant: {
        out = "${build variant}";
        # The build's `llamanix variant probe --json` (its version and commit, read from --version).
        capabilities = "${(build variant).passthru.capabilities}";
      };
    in
    {
      imports = [ module ];

      virtualisation.memorySize = 2048;
      virtualisation.cores = 2;

      services.llamanix = {
        enable = true;
        cudaArchs = [ ];
        instances.${instance} = {
          variant = base;
          model = "${model}";
          inherit alias port;
          context = 4096;
          parallel = 1;
          # The model drafts for itself: synthetic models are confident, so with p_min 0.6
          # the draft proposes tokens and the target accepts them (as in `llamanix demo`).
          speculative = {
            type = "draft";
            draft_model = "${model}";
            n_max = 8;
            p_min = 0.6;
          };
        };
        # The router's members: plain CPU instances of the same model. Their ports are internal
        # (the router assigns them), so they keep the default.
        instances.alpha = {
          variant = base;
          model = "${model}";
          context = 1024;
          parallel = 1;
        };
        instances.beta = {
          variant = base;
          model = "${model}";
          context = 1024;
          parallel = 1;
        };
        router = {
          kind = "llama-server";
          inherit (router) members port;
          # One member loaded at a time: asking for the other one swaps them.
          max_loaded = 1;
        };
        # What fromToml computes from a whole llamanix.toml, written out: each member is a
        # model group reached through the router.
        gateway = {
          inherit (gateway) port;
          api_key_file = gateway.keyFile;
          replicas = map (name: {
            instance = name;
            alias = name;
            url = "http://127.0.0.1:${toString router.port}/v1";
            apiKeyFile = null;
          }) router.members;
        };
      };

      # The master key, made at boot where sops-nix would put it, before the gateway's keys
      # unit reads it.
      systemd.services.vm-test-gateway-key = {
        requiredBy = [ "llamanix-gateway-keys.service" ];
        before = [ "llamanix-gateway-keys.service" ];
        serviceConfig = {
          Type = "oneshot";
          RemainAfterExit = true;
        };
        script = ''
          install -d -m 0751 /run/secrets
          umask 077
          head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n' > ${gateway.keyFile}
        '';
      };

      # The same instance, served by the other variant's build.
      specialisation.${other}.configuration = {
        services.llamanix.instances.${instance}.variant = lib.mkForce other;
      };

      # What the script expects, identical in both configurations.
      environment.etc."llamanix-vm-test.json".text = builtins.toJSON {
        inherit
          instance
          port
          alias
          base
          other
          ;
        model = "${model}";
        unit = "llamanix-${instance}.service";
        router = router // {
          unit = "llamanix-router.service";
        };
        gateway = gateway // {
          unit = "litellm.service";
          keysUnit = "llamanix-gateway-keys.service";
          models = router.members;
        };
        builds = {
          ${base} = expected base;
          ${other} = expected other;
        };
      };
    };

  # The script defines run(); the driver's globals are handed to it here, so the file itself
  # has no undefined names and lints on its own.
  testScript = builtins.readFile ./vm-test-script.py + "\nrun(machine, start_all, subtest)\n";
}
