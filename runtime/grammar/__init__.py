"""The tool grammar: the trie read from grammar.msgpack, its host-side stepper, and the
compiled walks (allowed edges, a pick and its forced tokens)."""
