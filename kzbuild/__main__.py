from kzbuild.cli import main

main()
