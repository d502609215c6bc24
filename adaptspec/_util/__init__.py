"""Private helpers shared across packages: atomic file writes (:mod:`.atomic`), the replace rule
every writer follows (:mod:`.outputs`), connecting to Ray (:mod:`.ray`) and markdown tables
(:mod:`.markdown`)."""
