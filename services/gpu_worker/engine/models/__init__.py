"""Model families: one file a family wires the shared layers together and maps checkpoint names;
``registry`` is the one list of what is supported."""
