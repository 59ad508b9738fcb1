"""PIC execution: the runner that plans and executes segmented prompts (layouts, store entry tables and writes, segment parallelism)."""
