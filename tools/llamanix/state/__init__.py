"""What llamanix keeps on disk, the only place that knows its layout: generations and the records
they hold (gate, gap, warm, up's status), the host lock, config edits and the crash points that test
them."""
