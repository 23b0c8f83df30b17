# services.llamanix.prometheus, evaluated for tests/test_prometheus_nix.py:
#
#   nix-instantiate --eval --strict --json tests/nix/prometheus-eval.nix \
#     --argstr toml PATH --argstr host HOST [--argstr enable true] [--argstr libPath DIR]
#
# Without libPath (CI: no nixpkgs) the stub lib stands in: the scrape job comes from
# nix/prometheus.nix with the [metrics] table's values over the schema's defaults, as the module
# system would give them. With libPath the real modules/llamanix.nix (which imports
# modules/prometheus.nix) is evaluated by lib.evalModules, with the NixOS options it sets
# declared loosely (tests/nix/nixos-stub.nix) and a package set of plain attribute sets.
{
  toml,
  host,
  enable ? "true",
  libPath ? "",
}:
let
  llamanixLib = import ../../nix/lib.nix;
  prometheusLib = import ../../nix/prometheus.nix;
  settings = llamanixLib.fromToml (/. + toml) host;
  metricsValues =
    builtins.mapAttrs (name: field: (settings.prometheus or { }).${name} or field.default)
      llamanixLib.schema.metrics;

  stubEval = {
    scrapeConfigs = [
      (prometheusLib.scrapeJob {
        inherit host;
        metrics = metricsValues;
      })
    ];
    metrics = metricsValues;
  };

  realEval =
    let
      lib = import libPath;
      nixosStub = import ./nixos-stub.nix { inherit lib; };
      store = name: "/nix/store/00000000000000000000000000000000-${name}";
      pkgs = {
        writeText = name: text: {
          inherit name text;
          outPath = store name;
        };
        runCommand =
          name: attrs: script:
          attrs
          // {
            inherit name script;
            outPath = store name;
          };
        runtimeShell = "/bin/sh";
        writeShellScript = name: text: {
          inherit name text;
          outPath = store name;
        };
        formats.yaml = _: {
          generate = name: value: {
            inherit name value;
            outPath = store name;
          };
        };
        stdenv.hostPlatform.system = "x86_64-linux";
        llamanixPackages = {
          llamanix.outPath = store "llamanix";
          mkVariant =
            { variant, cudaArchs }:
            {
              outPath = store "llama-cpp-${variant}";
              passthru.cudaSupport = cudaArchs != [ ];
            };
          mkCapabilities = _: store "capabilities.json";
        };
      };
      evaluated = lib.evalModules {
        modules = [
          ../../modules/llamanix.nix
          nixosStub
          {
            _module.args.pkgs = pkgs;
            networking.hostName = host;
            services.llamanix = settings // {
              enable = true;
            };
          }
          # Over fromToml's own, which enables it for a TOML with [metrics].
          { services.llamanix.prometheus.enable = lib.mkForce (enable == "true"); }
        ];
      };
      units = evaluated.config.system.build.llamanixUnits;
      prometheus = evaluated.config.services.prometheus;
    in
    {
      scrapeConfigs = prometheus.scrapeConfigs or null;
      ruleFiles = prometheus.ruleFiles or null;
      unitsPath = units.outPath;
      config = builtins.fromJSON units.passthru.configFile.text;
      exporter = evaluated.config.systemd.services.llamanix-exporter or null;
      ports = evaluated.config.networking.firewall.allowedTCPPorts or [ ];
      options = builtins.attrNames (
        builtins.removeAttrs evaluated.options.services.llamanix.prometheus [ "_module" ]
      );
    };
in
if libPath == "" then stubEval else realEval
