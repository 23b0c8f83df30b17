from llamanix.cli import main

main()
