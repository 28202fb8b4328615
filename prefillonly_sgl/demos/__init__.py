"""End-to-end demos on real data; `prefillonly demo` runs the default one."""
