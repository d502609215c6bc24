"""Private helpers shared across packages: atomic file writes (:mod:`.atomic`), the replace rule
every writer follows (:mod:`.outputs`), reading append-only JSON-lines files
(:mod:`.jsonlines`), connecting to Ray (:mod:`.ray`) and markdown tables (:mod:`.markdown`)."""
