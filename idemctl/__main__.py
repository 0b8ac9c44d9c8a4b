from idemctl.cli import main

main()
