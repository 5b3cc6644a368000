"""dagtop's command line: parses arguments and runs one command (record, report, advise, the live monitor, …);
the layer above everything else, which nothing of dagtop imports."""
