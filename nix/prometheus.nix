# The Prometheus side of one NixOS host (modules/prometheus.nix): its exporter's scrape job, as
# render/prometheus.py's scrape_job writes it for a host without a target (this machine).
# tests/test_prometheus_nix.py keeps the two equal. Pure: no nixpkgs needed to evaluate it.
let
  llamanixLib = import ./lib.nix;
in
{
  job = "llamanix";

  # metrics: the [metrics] table's values (listen, port, scrape_interval, ...).
  scrapeJob =
    { host, metrics }:
    {
      job_name = "llamanix";
      scrape_interval = "${toString metrics.scrape_interval}s";
      scrape_timeout = "${
        toString (if metrics.scrape_interval < 10 then metrics.scrape_interval else 10)
      }s";
      # The exporter's host and instance labels win over the target's (render/prometheus.py).
      honor_labels = true;
      static_configs = [
        {
          targets = [
            "${llamanixLib.urlHost (llamanixLib.connectHost metrics.listen)}:${toString metrics.port}"
          ];
          labels = { inherit host; };
        }
      ];
    };

  # Where the units derivation (modules/render-units.sh) leaves the rendered rules.
  rulesPath = units: "${units}/share/llamanix/prometheus/llamanix.rules.yml";
}
