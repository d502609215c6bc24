"""Private helpers shared across packages: reading a user's files, regular files only and every
decode failure one line (:mod:`.files`), atomic file writes (:mod:`.atomic`), the replace rule
every writer follows (:mod:`.outputs`), reading append-only JSON-lines files
(:mod:`.jsonlines`), connecting to Ray (:mod:`.ray`) and markdown tables (:mod:`.markdown`)."""
