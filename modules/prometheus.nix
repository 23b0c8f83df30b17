# services.llamanix.prometheus: the host's exporter (llamanix-exporter.service, `llamanix
# metrics`), and Prometheus told about it. Off by default.
#
# The options are llamanix.toml's [metrics] keys (schema.json), plus `enable` and
# `openFirewall`. When enabled, the units derivation renders the exporter unit and the alert
# rules beside the instances (the JSON it hands `llamanix render` gets a [metrics] table), and
# this module sets nixpkgs' own services.prometheus.scrapeConfigs and ruleFiles; it does not
# enable Prometheus itself (services.prometheus.enable), which may run on another machine.
#
# Only a host with instances has an exporter (as `llamanix render` has it: render/prometheus.py
# scrapes the hosts that run instances). fromToml enables this for every host of a TOML with a
# [metrics] table, the gateway's box among them: there it adds nothing.
{
  config,
  lib,
  ...
}:
let
  inherit (lib) mkEnableOption mkIf mkOption types;

  cfg = config.services.llamanix;
  pcfg = cfg.prometheus;
  schemaOptions = import ../nix/schema-options.nix { inherit lib; };
  prometheusLib = import ../nix/prometheus.nix;
  hostName = if config.networking.hostName != "" then config.networking.hostName else "localhost";
in
{
  options.services.llamanix.prometheus = schemaOptions.metricsOptions // {
    enable = mkEnableOption ''
      the llamanix exporter of this host (llamanix-exporter.service), with
      services.prometheus.scrapeConfigs and ruleFiles set for it (docs/observability.md)
    '';
    openFirewall = mkOption {
      type = types.bool;
      default = false;
      description = ''
        Open the exporter's `port` in the firewall, for a Prometheus on another machine (with
        `listen` set to an address that machine reaches).
      '';
    };
  };

  config = mkIf (cfg.enable && pcfg.enable && cfg.instances != { }) {
    services.prometheus.scrapeConfigs = [
      (prometheusLib.scrapeJob {
        host = hostName;
        metrics = pcfg;
      })
    ];
    services.prometheus.ruleFiles = [ (prometheusLib.rulesPath config.system.build.llamanixUnits) ];
    # The unit comes from the units package (hardening included); this drop-in only starts it.
    systemd.services.llamanix-exporter = {
      overrideStrategy = "asDropin";
      wantedBy = [ "multi-user.target" ];
    };
    networking.firewall.allowedTCPPorts = lib.optional pcfg.openFirewall pcfg.port;
  };
}
