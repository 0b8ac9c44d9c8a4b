from idemctl.cli import main

main()  # `python -m idemctl` is still idemctl: main() names the program itself
