"""A thin layer over the programs llamanix runs (nix, systemctl, systemd-analyze, llama-server's
own --help and --version) and over the files it writes atomically. One function per command."""
