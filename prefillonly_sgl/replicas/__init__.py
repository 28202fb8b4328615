"""Many `prefillonly serve` replicas behind SGLang's model gateway (`smg`), with requests
that share a prefix routed to the replica holding it: `prefillonly replicas`."""
