"""The paper map: a 2-D layout of the papers and the self-contained HTML page that shows it."""
